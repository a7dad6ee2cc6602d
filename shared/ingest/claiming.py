"""Claim: the batch a message's task runs, taken in one transaction. The message is a
wake-up, not an order: the batch is the next work in fair order over tenants, by bytes
(shared/jobs/repository.claim_fair_batch), and each job claimed is started (its lease
taken) with its document version's bytes read for the steps (a ``Claim``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from shared.db import UnitOfWork
from shared.db.repository import now
from shared.documents import repository as documents_repo
from shared.ingest.values import Claim, JobOutcome
from shared.jobs import repository as jobs_repo
from shared.jobs import service as jobs
from shared.models import DocumentVersion, IngestJob, JobState
from shared.queue import TaskQueue
from shared.settings import Settings


def claim(
    uow: UnitOfWork, job_id: uuid.UUID, settings: Settings, *, queue: TaskQueue
) -> list[Claim] | JobOutcome:
    """A batch for the message of ``job_id``. The message is a wake-up, not an order: the
    batch is the next work in fair order over tenants (:func:`fair_batch`), ``job_id``
    among the candidates like any other. If it is not taken, its message goes to the back of
    the queue again (after commit), so every queued job keeps a message of its own.

    A job already finished, or running under someone else's live lease (a duplicate
    delivery, most often a batch-mate's own message), is left alone: answered by a plain
    read first, without taking a lock. One that lost its worker too often runs alone."""
    session = uow.session
    finished = _duplicate_delivery(uow, job_id)
    if finished:
        return finished
    job = jobs_repo.lock_job(session, job_id)
    if job is None:
        return JobOutcome(str(job_id), "missing")
    if job.state in jobs.FINISHED:
        return JobOutcome(str(job_id), job.state, {"duplicate_delivery": True})
    current = now(session)
    if job.state == JobState.RUNNING and job.lease_expires_at and job.lease_expires_at > current:
        return JobOutcome(str(job_id), job.state, {"leased_elsewhere": True})
    if jobs.runs_alone(job) or job.state == JobState.RUNNING:  # alone, or a lease run out
        batch = [job]
    else:
        batch = list(fair_batch(uow, settings))
        if job not in batch:
            uow.after_commit(lambda: queue.publish_ingest_job(job_id))
            if not batch:  # nothing else claimable either: this one, then
                batch = [job]
    claims = _start_all(uow, batch, current, settings, queue=queue)
    own = next((c for c in claims if c.job_id == job_id), None)
    if own is None and job in batch:  # its content is gone: failed by _start
        return JobOutcome(str(job_id), job.state, {"error": job.error_message})
    return claims or JobOutcome(str(job_id), job.state, {"waits_its_turn": True})


def claim_listed(
    uow: UnitOfWork, job_ids: list[uuid.UUID], settings: Settings, *, queue: TaskQueue
) -> tuple[list[Claim], list[uuid.UUID]]:
    """A batch for a message of ``job_ids``: the next work in fair order over tenants (its
    jobs among the candidates like any other), and the listed jobs still queued after it,
    for a message of their own. Those finished or running elsewhere by now are left alone,
    and so is one that has lost too many attempts (its own message, the sweep's, runs it
    alone)."""
    session = uow.session
    listed = [job for job in jobs_repo.claimable_jobs(session, job_ids) if not jobs.runs_alone(job)]
    if not listed:
        return [], []
    batch = list(fair_batch(uow, settings))
    claims = _start_all(uow, batch, now(session), settings, queue=queue)
    taken = {job.id for job in batch}
    return claims, [j.id for j in listed if j.id not in taken]


def fair_batch(uow: UnitOfWork, settings: Settings) -> Sequence[IngestJob]:
    """The next batch of queued jobs in fair order over tenants, by bytes (see
    jobs.repository.claim_fair_batch): at most ``ingest_batch_jobs`` of them within
    ``ingest_batch_bytes`` together, a tenant with ``ingest_tenant_running_jobs`` jobs
    running already taken after every other one."""
    return jobs_repo.claim_fair_batch(
        uow.session,
        settings.ingest_batch_jobs,
        settings.ingest_batch_bytes,
        jobs.ISOLATE_AFTER_LOST_ATTEMPTS,
        settings.ingest_tenant_running_jobs,
    )


def _start_all(
    uow: UnitOfWork, batch: Sequence[IngestJob], at: Any, settings: Settings, *, queue: TaskQueue
) -> list[Claim]:
    versions = documents_repo.versions(uow.session, [(j.document_id, j.version) for j in batch])
    claims = [_start(uow, job, versions, at, settings, queue=queue) for job in batch]
    return [c for c in claims if c is not None]


def _duplicate_delivery(uow: UnitOfWork, job_id: uuid.UUID) -> JobOutcome | None:
    found = jobs_repo.job_state(uow.session, job_id)
    if found is None:
        return None
    state, lease_live = found
    if state in jobs.FINISHED:
        return JobOutcome(str(job_id), state, {"duplicate_delivery": True})
    if state == JobState.RUNNING and lease_live:
        return JobOutcome(str(job_id), state, {"leased_elsewhere": True})
    return None


def _start(
    uow: UnitOfWork,
    job: IngestJob,
    versions: dict[tuple[uuid.UUID, int], DocumentVersion],
    at: Any,
    settings: Settings,
    *,
    queue: TaskQueue,
) -> Claim | None:
    version = versions.get((job.document_id, job.version))
    if version is None or version.raw is None:
        jobs.fail_without_content(uow, job, at, queue=queue)
        return None
    jobs.start(job, at, settings)
    return Claim(
        job.id,
        job.tenant_id,
        job.document_id,
        job.version,
        version.raw,
        version.content_type,
        request_id=(job.detail or {}).get("request_id"),
        claimed_at=job.started_at,
    )
