"""The Postgres side of reranker training (all of its SQL): passages to train on."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.models import Chunk, Document, TrainingJob

# The chunks of each live document's current version.
_LIVE_CHUNKS = (Chunk.document_id == Document.id) & (Chunk.version == Document.version)


def first_chunks(
    session: Session, tenant_id: str, external_ids: set[str]
) -> list[tuple[str, str, str]]:
    """(external id, title, chunk text) of the named live documents' chunks, in document and
    chunk order."""
    rows = session.execute(
        select(Document.external_id, Document.title, Chunk.text)
        .join(Chunk, _LIVE_CHUNKS)
        .where(
            Document.tenant_id == tenant_id,
            Document.deleted.is_(False),
            any_of(Document.external_id, sorted(external_ids)),
        )
        .order_by(Document.external_id, Chunk.ordinal)
    )
    return [(external_id, title, text) for external_id, title, text in rows]


def random_chunks(
    session: Session, tenant_id: str, n: int, seed: float
) -> list[tuple[str, str, str]]:
    """``n`` random (external id, title, chunk text) of the tenant's live documents; the same
    ``seed`` (in [-1, 1]) draws the same ones from the same data."""
    session.execute(select(func.setseed(seed)))
    rows = session.execute(
        select(Document.external_id, Document.title, Chunk.text)
        .join(Chunk, _LIVE_CHUNKS)
        .where(Document.tenant_id == tenant_id, Document.deleted.is_(False))
        .order_by(func.random())
        .limit(n)
    )
    return [(external_id, title, text) for external_id, title, text in rows]


def add_training_job(session: Session, job: TrainingJob) -> None:
    session.add(job)


def training_job(session: Session, job_id: uuid.UUID, lock: bool = False) -> TrainingJob | None:
    return session.get(TrainingJob, job_id, with_for_update=lock)


def touch_running_training_job(session: Session, job_id: uuid.UUID) -> None:
    """The run's heartbeat: its row's ``updated_at`` is now, while it is running."""
    session.execute(
        update(TrainingJob)
        .where(TrainingJob.id == job_id, TrainingJob.state == "running")
        .values(updated_at=func.now())
    )


def external_ids_by_document(session: Session, tenant_id: str) -> dict[str, str]:
    """Document id (as a chunk id names it) -> external id, for the tenant's live documents."""
    rows = session.execute(
        select(Document.id, Document.external_id).where(
            Document.tenant_id == tenant_id, Document.deleted.is_(False)
        )
    )
    return {str(document_id): external_id for document_id, external_id in rows}
