"""Operator actions behind the admin CLI and the admin API: jobs, dead letters, reconcile
runs, stats. Functions take a session or unit of work and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from shared.admin.schemas import LastReconcile, ReconcileRunView, Stats
from shared.db import Transactions, UnitOfWork
from shared.db.repository import count_rows
from shared.documents import repository as documents_repo
from shared.errors import BadRequest, NotFound, StoreError
from shared.jobs import repository as jobs_repo
from shared.jobs import service as jobs
from shared.jobs.schemas import JobRow
from shared.models import DeadLetter, Document, DocumentVersion, JobState, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.queue import TaskQueue
from shared.reconcile import repository as reconcile_repo
from shared.settings import get_settings
from shared.stores.compose import Stores
from shared.stores.ports import ChunkAudit


def list_jobs(
    session: Session, *, state: str | None, stuck: bool, tenant_id: str | None, limit: int
) -> list[JobRow]:
    """Newest first, each named by its document's external id and title. ``tenant_id`` None
    lists every tenant's jobs: only the operator's CLI passes None."""
    if state and state not in {s.value for s in JobState}:
        raise BadRequest(f"unknown state {state!r}")
    found = jobs_repo.recent_jobs(
        session, state=state, stuck=stuck, tenant_id=tenant_id, limit=limit
    )
    documents = documents_repo.documents_by_ids(session, [j.document_id for j in found])
    return [jobs.job_row(j, documents.get(j.document_id)) for j in found]


def list_reconcile_runs(
    session: Session, *, tenant_id: str | None, limit: int
) -> list[ReconcileRunView]:
    """Recent reconcile runs, newest first, with what each found per drift class."""
    return [
        ReconcileRunView(
            id=run.id,
            tenant_id=run.tenant_id,
            started_at=run.started_at,
            duration_s=round(run.duration_s, 3),
            repair=run.repair,
            report=run.report,
        )
        for run in reconcile_repo.recent_runs(session, tenant_id=tenant_id, limit=limit)
    ]


def list_dead_letters(
    session: Session, *, tenant_id: str | None, limit: int
) -> Sequence[DeadLetter]:
    return jobs_repo.recent_dead_letters(session, tenant_id=tenant_id, limit=limit)


def get_dead_letter(session: Session, letter_id: int, tenant_id: str | None = None) -> DeadLetter:
    """``tenant_id``: only that tenant's letter (the API); None: any (the operator's CLI)."""
    letter = jobs_repo.dead_letter(session, letter_id)
    if letter is None or (tenant_id is not None and letter.tenant_id != tenant_id):
        raise NotFound(f"dead letter {letter_id} not found")
    return letter


def replay_dead_letter(
    uow: UnitOfWork, letter_id: int, tenant_id: str | None = None, *, queue: TaskQueue
) -> str:
    """Give the work another full set of attempts, then remove the letter."""
    session = uow.session
    letter = get_dead_letter(session, letter_id, tenant_id)
    if letter.source == "job":
        job = jobs_repo.job_by_id(session, uuid.UUID(letter.ref))
        if job is None:
            raise NotFound(f"job {letter.ref} no longer exists")
        jobs.queue_for_replay(uow, job, get_settings(), queue=queue)
        what = f"job {job.id} queued again"
    elif letter.source == "outbox":
        payload = letter.payload
        # The letter's own op: a repair or purge may overwrite or remove an equal version
        # (external_gte), which an index or delete at that version would leave as it is.
        recorded = str(payload.get("op"))
        op = OutboxOp(recorded) if recorded in set(OutboxOp) else OutboxOp.INDEX
        outbox_repo.add_outbox(
            session,
            tenant_id=letter.tenant_id,
            document_id=uuid.UUID(payload["document_id"]),
            op=op,
            version=int(payload["version"]),
            chunk_ids=[letter.ref],
        )
        uow.after_commit(queue.publish_relay)
        what = f"Elasticsearch {op} of {letter.ref} queued again"
    else:
        raise BadRequest(
            f"dead letter {letter.id} cannot be replayed: it is an upload refused at intake "
            f"({letter.message}); send a corrected upload (sync sends a file again once it "
            "changes), or discard the letter"
        )
    jobs_repo.delete_dead_letter(session, letter.id)
    return what


def discard_dead_letter(session: Session, letter_id: int, tenant_id: str | None = None) -> None:
    """Hide the letter for good. It is kept, not deleted: a refused upload's content digest
    in it is what keeps ``concord sync`` from sending the same file again until it changes."""
    get_dead_letter(session, letter_id, tenant_id)
    jobs_repo.discard_dead_letter(session, letter_id)


def system_stats(stores: Stores, transactions: Transactions, tenant_id: str | None = None) -> Stats:
    """Counts for one tenant (the API) or all (the operator's CLI); queue depths are shared.
    Postgres is counted first, in a transaction that ends before Redis and Elasticsearch are
    asked; either being down is reported in its field and the rest still answers."""
    with transactions() as uow:
        counted = _postgres_counts(uow.session, stores.vectors(uow.session), tenant_id)
    try:
        depths: dict[str, int] | str = stores.queue.queue_depths()
    except Exception as e:  # Redis down: say so, answer the rest
        depths = f"unavailable ({type(e).__name__})"
    try:
        es_chunks: int | str = stores.index.count_of_tenant(tenant_id)
    except StoreError as e:  # stats must answer when ES is down
        es_chunks = f"unavailable ({type(e).__name__})"
    return Stats(**counted, queue_depth=depths, chunks_elasticsearch=es_chunks)


def _postgres_counts(
    session: Session, vectors: ChunkAudit, tenant_id: str | None
) -> dict[str, Any]:
    last = reconcile_repo.last_run(session, tenant_id)
    return {
        "documents": count_rows(session, Document, tenant_id, Document.deleted.is_(False)),
        "deleted_documents": count_rows(session, Document, tenant_id, Document.deleted.is_(True)),
        "document_versions": count_rows(session, DocumentVersion, tenant_id),
        "chunks_postgres": vectors.count_of_tenant(tenant_id),
        "outbox_backlog": outbox_repo.outbox_backlog(session, tenant_id),
        "dead_letters": jobs_repo.dead_letter_count(session, tenant_id),
        "jobs": jobs_repo.job_state_counts(session, tenant_id),
        "last_reconcile": None
        if last is None
        else LastReconcile(
            at=last.started_at,
            repair=last.repair,
            duration_s=round(last.duration_s, 3),
            total_drift=last.report.get("total_drift"),
        ),
    }
