"""All SQL of the ingest side. Functions take a session and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
from sqlalchemy import Table, delete, func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import distinct_on, insert
from sqlalchemy.orm import Session, defer

from shared.db import any_of
from shared.models import (
    Base,
    Chunk,
    DeadLetter,
    Document,
    DocumentVersion,
    EmbeddingCache,
    EsOutbox,
    IngestJob,
    JobState,
    OutboxOp,
    ReconcileRun,
)
from shared.reconcile.buckets import bucket_of, fingerprint
from shared.vector_type import vector_bytes, vector_from_bytes


def lock_key(session: Session, key: str) -> None:
    """Serialize writers of one document (or one external id) until the transaction ends."""
    lock_keys(session, [key])


def lock_keys(session: Session, keys: Sequence[str]) -> None:
    """:func:`lock_key` for many keys in one round trip, always in the same (sorted) order, so
    that two writers of overlapping sets cannot deadlock."""
    session.execute(
        text(
            "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) "
            "FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS t(k, n) ORDER BY n"
        ),
        {"keys": sorted(set(keys))},
    )


# ------------------------------------------------------------------ documents


def documents_by_external_ids(
    session: Session, keys: Sequence[tuple[str, str]], for_update: bool = False
) -> dict[tuple[str, str], Document]:
    """The documents of (tenant id, external id) pairs that exist, by pair; with
    ``for_update``, locked in id order until commit."""
    if not keys:
        return {}
    query = select(Document).where(tuple_(Document.tenant_id, Document.external_id).in_(set(keys)))
    if for_update:
        query = query.order_by(Document.id).with_for_update()
    found = session.scalars(query)
    return {(d.tenant_id, d.external_id): d for d in found}


def insert_rows(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """Rows of ``model``'s table (column values by name) in one executemany: one cached
    statement whatever the count, which SQLAlchemy sends as multi-row VALUES batches."""
    if rows:
        session.connection().execute(insert(cast(Table, model.__table__)), rows)


def document_for_tenant(
    session: Session, tenant_id: str, document_id: uuid.UUID, for_update: bool = False
) -> Document | None:
    query = select(Document).where(Document.id == document_id, Document.tenant_id == tenant_id)
    return session.scalar(query.with_for_update() if for_update else query)


def list_documents(
    session: Session, tenant_id: str, limit: int, after: str | None = None
) -> Sequence[Document]:
    """The tenant's live documents in external-id order, ``limit`` after ``after``."""
    query = (
        select(Document)
        .where(Document.tenant_id == tenant_id, Document.deleted.is_(False))
        .order_by(Document.external_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(Document.external_id > after)
    return session.scalars(query).all()


def versions_of_jobs(
    session: Session, jobs: Sequence[IngestJob]
) -> dict[tuple[uuid.UUID, int], DocumentVersion]:
    """(document id, version) -> the document version each job processes, in one query."""
    keys = {(job.document_id, job.version) for job in jobs}
    if not keys:
        return {}
    rows = session.scalars(
        select(DocumentVersion).where(
            tuple_(DocumentVersion.document_id, DocumentVersion.version).in_(list(keys))
        )
    )
    return {(v.document_id, v.version): v for v in rows}


def list_versions(session: Session, document_id: uuid.UUID) -> Sequence[Any]:
    return session.execute(
        select(
            DocumentVersion.version,
            DocumentVersion.content_hash,
            DocumentVersion.tombstone,
            DocumentVersion.created_at,
        )
        .where(DocumentVersion.document_id == document_id)
        .order_by(DocumentVersion.version)
    ).all()


def latest_jobs_for(
    session: Session, versions: Collection[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], tuple[uuid.UUID, str]]:
    """(document id, version) -> the id and state of its newest job, for many in one query."""
    if not versions:
        return {}
    rows = session.execute(
        select(IngestJob.document_id, IngestJob.version, IngestJob.id, IngestJob.state)
        .ext(distinct_on(IngestJob.document_id, IngestJob.version))
        .where(tuple_(IngestJob.document_id, IngestJob.version).in_(list(versions)))
        .order_by(IngestJob.document_id, IngestJob.version, IngestJob.created_at.desc())
    )
    return {(document_id, version): (job_id, state) for document_id, version, job_id, state in rows}


# ------------------------------------------------------------------ jobs


def job_for_tenant(session: Session, tenant_id: str, job_id: uuid.UUID) -> IngestJob | None:
    return session.scalar(
        select(IngestJob).where(IngestJob.id == job_id, IngestJob.tenant_id == tenant_id)
    )


def lock_job(session: Session, job_id: uuid.UUID) -> IngestJob | None:
    return session.scalar(select(IngestJob).where(IngestJob.id == job_id).with_for_update())


def lock_jobs(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, IngestJob]:
    """:func:`lock_job` for many jobs in one query (locked in id order)."""
    if not job_ids:
        return {}
    jobs = session.scalars(
        select(IngestJob)
        .where(any_of(IngestJob.id, job_ids))
        .order_by(IngestJob.id)
        .with_for_update()
    )
    return {job.id: job for job in jobs}


def expired_jobs(session: Session, limit: int) -> Sequence[IngestJob]:
    """Queued or running jobs whose lease ran out: their message or worker was lost."""
    return session.scalars(
        select(IngestJob)
        .where(
            IngestJob.state.in_([JobState.QUEUED, JobState.RUNNING]),
            IngestJob.lease_expires_at < func.now(),
        )
        .order_by(IngestJob.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def queued_jobs_published_before(
    session: Session, published_before: datetime, lease_seconds: int, limit: int
) -> Sequence[IngestJob]:
    """Queued jobs whose message went out before ``published_before`` (a lease starts when
    its message is published), oldest first."""
    return session.scalars(
        select(IngestJob)
        .where(
            IngestJob.state == JobState.QUEUED,
            IngestJob.lease_expires_at < published_before + timedelta(seconds=lease_seconds),
        )
        .order_by(IngestJob.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def extend_lease(job: IngestJob, at: datetime, seconds: int) -> None:
    job.lease_expires_at = at + timedelta(seconds=seconds)


def renew_leases(session: Session, job_ids: Sequence[uuid.UUID], seconds: int) -> None:
    """The heartbeat: the leases of those of ``job_ids`` still running, from the database's
    clock."""
    session.execute(
        update(IngestJob)
        .where(any_of(IngestJob.id, job_ids), IngestJob.state == JobState.RUNNING)
        .values(lease_expires_at=func.now() + timedelta(seconds=seconds))
    )


def add_dead_letter(
    session: Session,
    *,
    tenant_id: str,
    source: str,
    ref: str,
    stage: str,
    error_class: str,
    message: str,
    attempts: int,
    payload: dict[str, Any] | None = None,
) -> None:
    session.add(
        DeadLetter(
            tenant_id=tenant_id,
            source=source,
            ref=ref,
            stage=stage,
            error_class=error_class,
            message=message[:4000],
            attempts=attempts,
            payload=payload or {},
        )
    )


# ------------------------------------------------------------------ chunks


@dataclass(frozen=True)
class ChunkRow:
    id: str
    ordinal: int
    text: str
    text_hash: str
    char_start: int
    char_end: int
    section: str
    token_count: int
    embedding: np.ndarray


@dataclass(frozen=True)
class VersionChunks:
    """One document version's chunks, as the pipeline writes them."""

    tenant_id: str
    document_id: uuid.UUID
    version: int
    external_id: str
    title: str
    metadata: dict[str, Any]
    rows: Sequence[ChunkRow]


def upsert_chunks(session: Session, versions: Sequence[VersionChunks]) -> None:
    """Write the chunks of many document versions in one statement; an older version can
    never overwrite a newer one. At most one entry per document (Postgres refuses to update
    one row twice in a statement)."""
    values = [
        {
            "id": r.id,
            "tenant_id": v.tenant_id,
            "document_id": v.document_id,
            "version": v.version,
            "ordinal": r.ordinal,
            "text": r.text,
            "text_hash": r.text_hash,
            "char_start": r.char_start,
            "char_end": r.char_end,
            "section": r.section,
            "title": v.title,
            "token_count": r.token_count,
            "bucket": bucket_of(r.id),
            "fingerprint": fingerprint(
                chunk_id=r.id,
                tenant_id=v.tenant_id,
                document_id=str(v.document_id),
                external_id=v.external_id,
                version=v.version,
                ordinal=r.ordinal,
                text_hash=r.text_hash,
                title=v.title,
                section=r.section,
                metadata=v.metadata,
            ),
            "embedding": r.embedding,
            "metadata": v.metadata,
        }
        for v in versions
        for r in v.rows
    ]
    if not values:
        return
    chunks = cast(Table, Chunk.__table__)
    statement = insert(chunks)
    excluded = statement.excluded
    # Executed with a list of rows: one cached statement whatever the count, which
    # SQLAlchemy sends as multi-row VALUES batches.
    session.connection().execute(
        statement.on_conflict_do_update(
            index_elements=[chunks.c.id],
            set_={
                "version": excluded.version,
                "ordinal": excluded.ordinal,
                "text": excluded.text,
                "text_hash": excluded.text_hash,
                "char_start": excluded.char_start,
                "char_end": excluded.char_end,
                "section": excluded.section,
                "title": excluded.title,
                "token_count": excluded.token_count,
                "fingerprint": excluded.fingerprint,
                "embedding": excluded.embedding,
                "metadata": excluded.metadata,
                "updated_at": func.now(),
            },
            where=chunks.c.version <= excluded.version,
        ),
        values,
    )


def delete_chunks_older_than(session: Session, document_id: uuid.UUID, version: int) -> list[str]:
    """Remove the chunks a newer version superseded (or a tombstone deleted); returns ids."""
    return delete_superseded_chunks(session, {document_id: version}).get(document_id, [])


def delete_superseded_chunks(
    session: Session, versions: dict[uuid.UUID, int]
) -> dict[uuid.UUID, list[str]]:
    """:func:`delete_chunks_older_than` for many documents in one statement: document id ->
    the ids it removed."""
    if not versions:
        return {}
    result = session.execute(
        text(
            "DELETE FROM chunks c "
            "USING unnest(CAST(:documents AS uuid[]), CAST(:versions AS integer[])) "
            "AS live(document_id, version) "
            "WHERE c.document_id = live.document_id AND c.version < live.version "
            "RETURNING c.document_id, c.id"
        ),
        {"documents": list(versions), "versions": list(versions.values())},
    )
    removed: dict[uuid.UUID, list[str]] = {}
    for document_id, chunk_id in result:
        removed.setdefault(document_id, []).append(chunk_id)
    return removed


def chunks_by_ids(session: Session, ids: Sequence[str]) -> dict[str, Chunk]:
    """The chunks that exist, by id, without their embeddings (which none of the callers
    needs and which cost the most to read)."""
    if not ids:
        return {}
    query = (
        select(Chunk).where(any_of(Chunk.id, ids)).options(defer(Chunk.embedding, raiseload=True))
    )
    return {c.id: c for c in session.scalars(query)}


# ------------------------------------------------------------------ embedding cache


def cached_embeddings(session: Session, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
    if not hashes:
        return {}
    rows = session.execute(
        select(EmbeddingCache.text_hash, vector_bytes(EmbeddingCache.embedding)).where(
            EmbeddingCache.model == model, any_of(EmbeddingCache.text_hash, hashes)
        )
    )
    return {h: vector_from_bytes(raw) for h, raw in rows}


def store_embeddings(session: Session, model: str, vectors: dict[str, np.ndarray]) -> None:
    if not vectors:
        return
    # Executed with a list of rows, sent as multi-row VALUES batches (see insert_rows).
    session.connection().execute(
        insert(cast(Table, EmbeddingCache.__table__)).on_conflict_do_nothing(),
        [{"model": model, "text_hash": h, "embedding": v} for h, v in vectors.items()],
    )


# ------------------------------------------------------------------ outbox


@dataclass(frozen=True)
class OutboxEntry:
    tenant_id: str
    document_id: uuid.UUID
    op: OutboxOp
    version: int
    chunk_ids: Sequence[str]


def add_outbox(
    session: Session,
    *,
    tenant_id: str,
    document_id: uuid.UUID,
    op: OutboxOp,
    version: int,
    chunk_ids: Sequence[str],
) -> None:
    add_outbox_entries(session, [OutboxEntry(tenant_id, document_id, op, version, chunk_ids)])


def add_outbox_entries(session: Session, entries: Sequence[OutboxEntry]) -> None:
    """One outbox row per chunk id of every entry, in one statement."""
    values = [
        {
            "tenant_id": e.tenant_id,
            "document_id": e.document_id,
            "chunk_id": cid,
            "op": e.op.value,
            "version": e.version,
        }
        for e in entries
        for cid in e.chunk_ids
    ]
    insert_rows(session, EsOutbox, values)


def claim_outbox(session: Session, limit: int) -> Sequence[EsOutbox]:
    """Due rows, locked so that concurrent relays never send the same row twice."""
    return session.scalars(
        select(EsOutbox)
        .where(EsOutbox.next_attempt_at <= func.now())
        .order_by(EsOutbox.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def due_outbox_rows_for(session: Session, chunk_ids: Sequence[str]) -> int:
    """Rows of these chunks that are due, whether or not a relay holds them right now."""
    return count_rows(
        session,
        EsOutbox,
        None,
        any_of(EsOutbox.chunk_id, chunk_ids),
        EsOutbox.next_attempt_at <= func.now(),
    )


def delete_outbox(session: Session, ids: Sequence[int]) -> None:
    if ids:
        session.execute(delete(EsOutbox).where(any_of(EsOutbox.id, ids)))


def postpone_outbox(
    session: Session, ids: Sequence[int], delay_s: float, error: str, count_attempt: bool
) -> None:
    if not ids:
        return
    values: dict[str, Any] = {
        "next_attempt_at": func.now() + timedelta(seconds=delay_s),
        "last_error": error[:2000],
    }
    if count_attempt:
        values["attempts"] = EsOutbox.attempts + 1
    session.execute(update(EsOutbox).where(any_of(EsOutbox.id, ids)).values(**values))


def count_rows(session: Session, model: Any, tenant_id: str | None = None, *conditions: Any) -> int:
    """Rows of ``model`` matching ``conditions``, within one tenant unless ``tenant_id`` is
    None (the operator's view of every tenant)."""
    if tenant_id is not None:
        conditions = (*conditions, model.tenant_id == tenant_id)
    return session.scalar(select(func.count()).select_from(model).where(*conditions)) or 0


def outbox_backlog(session: Session, tenant_id: str | None = None) -> int:
    query = select(func.count()).select_from(EsOutbox)
    if tenant_id is not None:
        query = query.where(EsOutbox.tenant_id == tenant_id)
    return session.scalar(query) or 0


def documents_by_ids(session: Session, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Document]:
    if not ids:
        return {}
    return {d.id: d for d in session.scalars(select(Document).where(any_of(Document.id, ids)))}


def count_chunks(session: Session, document_id: uuid.UUID) -> int:
    return (
        session.scalar(
            select(func.count()).select_from(Chunk).where(Chunk.document_id == document_id)
        )
        or 0
    )


def live_job_states(
    session: Session, tenant_id: str, external_ids: Sequence[str]
) -> dict[str, str]:
    """external id -> state of the job for the document's live version (when there is one)."""
    if not external_ids:
        return {}
    rows = session.execute(
        select(Document.external_id, IngestJob.state)
        .join(
            IngestJob,
            (IngestJob.document_id == Document.id) & (IngestJob.version == Document.version),
        )
        .where(Document.tenant_id == tenant_id, Document.external_id.in_(list(external_ids)))
    ).all()
    return {external_id: state for external_id, state in rows}


def dead_letter_count(session: Session, tenant_id: str | None = None) -> int:
    query = select(func.count()).select_from(DeadLetter)
    if tenant_id is not None:
        query = query.where(DeadLetter.tenant_id == tenant_id)
    return session.scalar(query) or 0


def job_state_counts(session: Session, tenant_id: str | None = None) -> dict[str, int]:
    query = select(IngestJob.state, func.count()).group_by(IngestJob.state)
    if tenant_id is not None:
        query = query.where(IngestJob.tenant_id == tenant_id)
    return {state: count for state, count in session.execute(query)}


def stage_time_totals(session: Session) -> dict[str, tuple[int, float]]:
    """stage -> (jobs that recorded it, total seconds), over finished jobs."""
    rows = session.execute(
        text(
            "SELECT key, count(*), sum(value::float) FROM ingest_jobs, "
            "jsonb_each_text(stage_timings) WHERE state = 'indexed' GROUP BY key"
        )
    )
    return {stage: (int(count), float(total)) for stage, count, total in rows}


def claim_queued_jobs(
    session: Session, limit: int, exclude: uuid.UUID, max_bytes: int
) -> Sequence[IngestJob]:
    """Oldest queued jobs that no one else is claiming right now (for batching), at most
    ``limit`` of them and at most ``max_bytes`` of raw content together: a batch is bounded
    by its work, not only by its job count.

    (Newest-first was tried, so that the messages that come next still find their own jobs
    queued: it let the batches run ahead of the intake events in the same queue, which then
    ran on their own afterwards, with no encoding beside them; the run took longer.)"""
    if limit <= 0 or max_bytes <= 0:
        return []
    rows = session.execute(
        select(IngestJob, func.coalesce(func.octet_length(DocumentVersion.raw), 0))
        .join(
            DocumentVersion,
            (DocumentVersion.document_id == IngestJob.document_id)
            & (DocumentVersion.version == IngestJob.version),
        )
        .where(IngestJob.state == JobState.QUEUED, IngestJob.id != exclude)
        .order_by(IngestJob.created_at)
        .limit(limit)
        .with_for_update(of=IngestJob, skip_locked=True)
    ).all()
    taken, total = [], 0
    for job, size in rows:
        total += size
        if total > max_bytes:
            break
        taken.append(job)
    return taken


def claimable_jobs(session: Session, job_ids: Sequence[uuid.UUID]) -> Sequence[IngestJob]:
    """Of ``job_ids``, those queued, or running under a lease that has run out, and not being
    claimed by anyone else right now; locked."""
    if not job_ids:
        return []
    return session.scalars(
        select(IngestJob)
        .where(
            any_of(IngestJob.id, job_ids),
            (IngestJob.state == JobState.QUEUED)
            | ((IngestJob.state == JobState.RUNNING) & (IngestJob.lease_expires_at < func.now())),
        )
        .order_by(IngestJob.id)
        .with_for_update(skip_locked=True)
    ).all()


def job_state(session: Session, job_id: uuid.UUID) -> tuple[str, bool] | None:
    """The job's state and whether its lease is live (by the database clock)."""
    row = session.execute(
        select(IngestJob.state, IngestJob.lease_expires_at > func.now()).where(
            IngestJob.id == job_id
        )
    ).one_or_none()
    return None if row is None else (row[0], bool(row[1]))


def last_reconcile(session: Session, tenant_id: str | None = None) -> ReconcileRun | None:
    query = select(ReconcileRun).order_by(ReconcileRun.id.desc()).limit(1)
    if tenant_id is not None:
        query = query.where(ReconcileRun.tenant_id == tenant_id)
    return session.scalar(query)
