"""Operator actions behind the admin CLI and the admin API: jobs, dead letters,
stats. Functions take a session or unit of work and never commit."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

from elasticsearch import ApiError, TransportError
from sqlalchemy.orm import Session

from shared.admin import repository as repo
from shared.db import UnitOfWork, now, unit_of_work
from shared.errors import BadRequest, NotFound
from shared.ingest import repository as ingest_repo
from shared.models import (
    Chunk,
    DeadLetter,
    Document,
    DocumentVersion,
    IngestJob,
    JobState,
    OutboxOp,
)
from shared.queue import publish_ingest_job, publish_relay, queue_depths
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex


def list_jobs(
    session: Session, *, state: str | None, stuck: bool, tenant_id: str | None, limit: int
) -> Sequence[IngestJob]:
    """``tenant_id`` None lists every tenant's jobs: only the operator's CLI passes None."""
    if state and state not in {s.value for s in JobState}:
        raise BadRequest(f"unknown state {state!r}")
    return repo.recent_jobs(session, state=state, stuck=stuck, tenant_id=tenant_id, limit=limit)


def job_dict(j: IngestJob) -> dict[str, Any]:
    return {
        "id": str(j.id),
        "tenant_id": j.tenant_id,
        "document_id": str(j.document_id),
        "version": j.version,
        "state": j.state,
        "attempts": j.attempts,
        "error": j.error_message,
        "error_stage": j.error_stage,
        "stage_timings": j.stage_timings,
        "created_at": j.created_at.isoformat(),
        "finished_at": j.finished_at.isoformat() if j.finished_at else None,
        "lease_expires_at": j.lease_expires_at.isoformat() if j.lease_expires_at else None,
    }


def list_reconcile_runs(
    session: Session, *, tenant_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """Recent reconcile runs, newest first, with what each found per drift class."""
    return [
        {
            "id": run.id,
            "tenant_id": run.tenant_id,
            "started_at": run.started_at.isoformat(),
            "duration_s": round(run.duration_s, 3),
            "repair": run.repair,
            "report": run.report,
        }
        for run in repo.recent_reconcile_runs(session, tenant_id=tenant_id, limit=limit)
    ]


def list_dead_letters(
    session: Session, *, tenant_id: str | None, limit: int
) -> Sequence[DeadLetter]:
    return repo.recent_dead_letters(session, tenant_id=tenant_id, limit=limit)


def get_dead_letter(session: Session, letter_id: int, tenant_id: str | None = None) -> DeadLetter:
    """``tenant_id``: only that tenant's letter (the API); None: any (the operator's CLI)."""
    letter = session.get(DeadLetter, letter_id)
    if letter is None or (tenant_id is not None and letter.tenant_id != tenant_id):
        raise NotFound(f"dead letter {letter_id} not found")
    return letter


def dead_letter_dict(d: DeadLetter) -> dict[str, Any]:
    return {
        "id": d.id,
        "tenant_id": d.tenant_id,
        "source": d.source,
        "ref": d.ref,
        "stage": d.stage,
        "error_class": d.error_class,
        "message": d.message,
        "attempts": d.attempts,
        "payload": d.payload,
        "created_at": d.created_at.isoformat(),
    }


def replay_dead_letter(uow: UnitOfWork, letter_id: int, tenant_id: str | None = None) -> str:
    """Give the work another full set of attempts, then remove the letter."""
    session = uow.session
    letter = get_dead_letter(session, letter_id, tenant_id)
    if letter.source == "job":
        job = session.get(IngestJob, uuid.UUID(letter.ref))
        if job is None:
            raise NotFound(f"job {letter.ref} no longer exists")
        job.state = JobState.QUEUED
        job.attempts = 0
        job.error_stage = job.error_class = job.error_message = None
        job.finished_at = None
        ingest_repo.extend_lease(job, now(session), get_settings().queued_republish_seconds)
        uow.after_commit(functools.partial(publish_ingest_job, job.id))
        what = f"job {job.id} queued again"
    elif letter.source == "outbox":
        payload = letter.payload
        op = OutboxOp.DELETE if payload.get("op") in ("delete", "purge") else OutboxOp.INDEX
        ingest_repo.add_outbox(
            session,
            tenant_id=letter.tenant_id,
            document_id=uuid.UUID(payload["document_id"]),
            op=op,
            version=int(payload["version"]),
            chunk_ids=[letter.ref],
        )
        uow.after_commit(publish_relay)
        what = f"Elasticsearch {op} of {letter.ref} queued again"
    else:
        raise BadRequest(
            f"a {letter.source} dead letter cannot be replayed; the producer must "
            "publish a corrected event"
        )
    session.delete(letter)
    return what


def discard_dead_letter(session: Session, letter_id: int, tenant_id: str | None = None) -> None:
    get_dead_letter(session, letter_id, tenant_id)
    repo.delete_dead_letter(session, letter_id)


def system_stats(tenant_id: str | None = None) -> dict[str, Any]:
    """Counts for one tenant (the API) or all (the operator's CLI); queue depths are shared."""
    settings = get_settings()
    count = ingest_repo.count_rows
    with unit_of_work() as uow:
        s = uow.session
        body: dict[str, Any] = {
            "documents": count(s, Document, tenant_id, Document.deleted.is_(False)),
            "deleted_documents": count(s, Document, tenant_id, Document.deleted.is_(True)),
            "document_versions": count(s, DocumentVersion, tenant_id),
            "chunks_postgres": count(s, Chunk, tenant_id),
            "outbox_backlog": ingest_repo.outbox_backlog(s, tenant_id),
            "dead_letters": ingest_repo.dead_letter_count(s, tenant_id),
            "jobs": ingest_repo.job_state_counts(s, tenant_id),
        }
        last = ingest_repo.last_reconcile(s, tenant_id)
        body["last_reconcile"] = (
            None
            if last is None
            else {
                "at": last.started_at.isoformat(),
                "repair": last.repair,
                "duration_s": round(last.duration_s, 3),
                "total_drift": last.report.get("total_drift"),
            }
        )
    try:
        body["queue_depth"] = queue_depths()
    except Exception as e:  # Redis down: say so, answer the rest
        body["queue_depth"] = f"unavailable ({type(e).__name__})"
    try:
        body["chunks_elasticsearch"] = ElasticsearchChunkIndex(settings=settings).count_of_tenant(
            tenant_id
        )
    except (ApiError, TransportError) as e:  # stats must answer when ES is down
        body["chunks_elasticsearch"] = f"unavailable ({type(e).__name__})"
    return body
