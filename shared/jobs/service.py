"""A job's life: queued → running (claimed, under a lease its worker's heartbeat renews) →
indexed, failed or dead-lettered; released back to the queue on errors a retry may fix, given
up on after its attempts. Functions take the caller's unit of work (or a job row it locked)
and never commit."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from shared.db import Transactions, UnitOfWork
from shared.db.repository import now
from shared.jobs import repository as repo
from shared.jobs.schemas import DeadLetterView, IngestJobView, JobError, JobRow, TrainingJobView
from shared.models import DeadLetter, Document, IngestJob, JobState, TrainingJob
from shared.queue import TaskQueue
from shared.retry import describe_error
from shared.settings import Settings
from shared.webhooks import service as webhooks

FINISHED = (JobState.INDEXED, JobState.FAILED, JobState.DEAD_LETTERED)
# A running training job's heartbeat writes every 10 s (training/jobs.py); one silent for this
# long lost its worker (the task acks on start, so nothing redelivers it). A queued one silent
# for TRAINING_MESSAGE_LOST_AFTER lost its message (it may be waiting behind a long run on
# the training queue: published again only that rarely).
TRAINING_LOST_AFTER = timedelta(minutes=1)
TRAINING_MESSAGE_LOST_AFTER = timedelta(minutes=10)


# A batch holds many tenants' jobs. When it ends with no outcome of any job's own (its worker
# killed or out of memory while it ran, or the batch out of time), nothing says which job
# caused it, so each job counts a lost attempt; one that has lost this many runs alone from
# then on. A document that kills its worker every time then uses up its own attempts alone,
# and its batch-mates lose at most this many of theirs (two: one random kill does not slow
# the recovery of a whole batch by running it one job at a time).
ISOLATE_AFTER_LOST_ATTEMPTS = 2


def runs_alone(job: IngestJob) -> bool:
    """Whether ``job``, about to be claimed, runs in a batch of its own: counting the attempt
    it lost if it is still ``running`` under a lease that ran out."""
    lost = job.attempts_lost + (1 if job.state == JobState.RUNNING else 0)
    return lost >= ISOLATE_AFTER_LOST_ATTEMPTS


def lose_attempt(job: IngestJob) -> None:
    """The job's attempt ended without an outcome of its own (see above)."""
    job.attempts_lost += 1


def extend_lease(job: IngestJob, at: datetime, seconds: int) -> None:
    job.lease_expires_at = at + timedelta(seconds=seconds)


def start(job: IngestJob, at: datetime, settings: Settings) -> None:
    """Claimed: running under a fresh lease, one more attempt counted. A job claimed while
    still ``running`` (its lease ran out before the sweep saw it) lost its last attempt."""
    if job.state == JobState.RUNNING:
        lose_attempt(job)
    job.state = JobState.RUNNING
    job.attempts += 1
    job.started_at = at
    extend_lease(job, at, settings.job_lease_seconds)


def finish(job: IngestJob, detail: dict[str, Any], at: datetime) -> None:
    job.state = JobState.INDEXED
    job.attempts_lost = 0  # reprocessed later (concord reembed), it is batched again
    job.finished_at = at
    job.lease_expires_at = None
    job.error_stage = job.error_class = job.error_message = None
    job.detail = detail


def fail_without_content(
    uow: UnitOfWork, job: IngestJob, at: datetime, *, queue: TaskQueue
) -> None:
    job.state = JobState.FAILED
    job.error_stage, job.error_class = "claim", "MissingContent"
    job.error_message = "the document version has no stored content"
    job.finished_at = at
    webhooks.job_finished(uow, [job], queue=queue)


def fail(
    uow: UnitOfWork,
    job_id: uuid.UUID,
    stage: str,
    error: BaseException,
    *,
    dead_letter: bool,
    queue: TaskQueue,
) -> None:
    """Record that the job failed at ``stage``: ``failed``, or ``dead_lettered`` with a dead
    letter an operator can replay. A job finished meanwhile (by a worker that took it over)
    is left as it is."""
    session = uow.session
    job = repo.lock_job(session, job_id)
    if job is None or job.state in (JobState.INDEXED, JobState.DEAD_LETTERED):
        return
    job.state = JobState.DEAD_LETTERED if dead_letter else JobState.FAILED
    job.error_stage = stage
    job.error_class = type(error).__name__
    job.error_message = describe_error(error)
    job.finished_at = now(session)
    job.lease_expires_at = None
    if dead_letter:
        _add_dead_letter(uow, job)
    webhooks.job_finished(uow, [job], queue=queue)


def record_failure(
    uow: UnitOfWork, job_id: uuid.UUID, error: BaseException, *, queue: TaskQueue
) -> None:
    """A task's retries are spent, or its error is not one a retry fixes: the job is
    dead-lettered with the error, where an operator can see and replay it."""
    fail(uow, job_id, "process", error, dead_letter=True, queue=queue)


def release(
    uow: UnitOfWork,
    claims: Mapping[uuid.UUID, datetime | None],
    settings: Settings,
    retried_by_task: uuid.UUID | None,
    lost: bool = False,
    *,
    queue: TaskQueue,
) -> None:
    """Hand unfinished jobs back to the queue at once, each with a message of its own, except
    ``retried_by_task``: its task's retry brings it back, and should that message be lost,
    its lease (expired now) lets the next sweep publish it. ``claims``: when the releasing
    batch's claim of each job began (its ``started_at``, which only a claim sets); a job
    claimed again since (by a worker that took it over once its lease ran out) is not the
    batch's to release. ``lost``: the attempt
    ended with no outcome of the jobs' own (the batch ran out of time), counted as such."""
    current = now(uow.session)
    for job in repo.lock_jobs(uow.session, list(claims)).values():
        if job.state != JobState.RUNNING or job.started_at != claims[job.id]:
            continue
        if lost:
            lose_attempt(job)
        job.state = JobState.QUEUED
        if job.id == retried_by_task:
            job.lease_expires_at = current
        else:
            publish_again(uow, job, current, settings, queue=queue)


def wait_next_turn(
    uow: UnitOfWork, job_ids: Sequence[uuid.UUID], settings: Settings, *, queue: TaskQueue
) -> None:
    """Running jobs whose turn is over before they are done (a large document's chunks are
    encoded a turn at a time): queued again with a message each, the turn not counted as an
    attempt (a document of 10,000 chunks takes forty turns, not forty of its attempts)."""
    current = now(uow.session)
    for job in repo.lock_jobs(uow.session, job_ids).values():
        if job.state != JobState.RUNNING:
            continue
        job.attempts = max(0, job.attempts - 1)
        job.state = JobState.QUEUED
        publish_again(uow, job, current, settings, queue=queue)


def publish_again(
    uow: UnitOfWork, job: IngestJob, at: datetime, settings: Settings, *, queue: TaskQueue
) -> str:
    """A fresh lease for a queued job, and its message again once the lease is committed."""
    extend_lease(job, at, settings.queued_republish_seconds)
    uow.after_commit(functools.partial(queue.publish_ingest_job, job.id))
    return str(job.id)


def give_up(uow: UnitOfWork, job: IngestJob, at: datetime, *, queue: TaskQueue) -> None:
    """The job's lease ran out once too often: dead-lettered with the last error it recorded."""
    job.state = JobState.DEAD_LETTERED
    job.error_stage = job.error_stage or "lease"
    job.error_class = job.error_class or "LeaseExpired"
    lost = f" ({job.attempts_lost} ended with their worker lost or out of time)"
    job.error_message = (
        f"gave up after {job.attempts} attempts{lost if job.attempts_lost else ''}; last error: "
        f"{job.error_message or 'the worker disappeared while holding the lease'}"
    )
    job.finished_at = at
    job.lease_expires_at = None
    _add_dead_letter(uow, job)
    webhooks.job_finished(uow, [job], queue=queue)


REPROCESS_PAGE = 1000  # jobs locked and queued again per transaction by reprocess_tenant


def reprocess_tenant(
    transactions: Transactions,
    tenant_id: str,
    settings: Settings,
    page: int = REPROCESS_PAGE,
    *,
    queue: TaskQueue,
) -> list[uuid.UUID]:
    """Run every live document of the tenant through the pipeline again at its live version
    (``concord reembed``: after a change to how chunks are made or embedded). The chunks are
    rewritten at the same version; unchanged ones come from the embedding cache.

    A page of jobs per transaction, in id order (a tenant's whole corpus in one would hold
    every job's row lock until the last was queued), each page's jobs published after its
    commit in batches of ``ingest_batch_jobs``, as accepted uploads are."""
    queued: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    size = max(settings.ingest_batch_jobs, 1)
    while True:
        with transactions() as uow:
            listed = repo.indexed_live_version_jobs(uow.session, tenant_id, after, page)
            current = now(uow.session)
            for job in listed:
                _reset_for_replay(job)
                extend_lease(job, current, settings.queued_republish_seconds)
            ids = [job.id for job in listed]
            for start in range(0, len(ids), size):
                uow.after_commit(
                    functools.partial(queue.publish_ingest_jobs, ids[start : start + size])
                )
        if not ids:  # only an empty page ends it: a locked page may come back short
            return queued
        queued += ids
        after = ids[-1]


def queue_for_replay(
    uow: UnitOfWork, job: IngestJob, settings: Settings, *, queue: TaskQueue
) -> None:
    """An operator's replay: a fresh set of attempts, published after commit."""
    _reset_for_replay(job)
    publish_again(uow, job, now(uow.session), settings, queue=queue)


def _reset_for_replay(job: IngestJob) -> None:
    job.state = JobState.QUEUED
    job.attempts = job.attempts_lost = 0
    job.error_stage = job.error_class = job.error_message = None
    job.finished_at = None


def training_job_view(job: TrainingJob, current_time: datetime) -> TrainingJobView:
    state = job.state
    if state == "running" and current_time - job.updated_at > TRAINING_LOST_AFTER:
        state = "lost"
    return TrainingJobView(
        id=job.id,
        name=job.name,
        state=state,
        progress=job.progress,
        result=job.result,
        error=job.error,
        created_at=job.created_at,
        updated_at=job.updated_at,
    )


def _add_dead_letter(uow: UnitOfWork, job: IngestJob) -> None:
    repo.add_dead_letter(
        uow.session,
        tenant_id=job.tenant_id,
        source="job",
        ref=str(job.id),
        stage=job.error_stage or "process",
        error_class=job.error_class or "Error",
        message=job.error_message or "",
        attempts=job.attempts,
        payload={"document_id": str(job.document_id), "version": job.version},
    )


def ingest_job_view(job: IngestJob) -> IngestJobView:
    error = (
        None
        if job.error_class is None
        else JobError.model_validate(
            {"stage": job.error_stage, "class": job.error_class, "message": job.error_message}
        )
    )
    return IngestJobView(
        id=job.id,
        document_id=job.document_id,
        version=job.version,
        state=job.state,
        attempts=job.attempts,
        error=error,
        stage_timings=job.stage_timings,
        detail=job.detail,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def job_row(job: IngestJob, document: Document | None) -> JobRow:
    return JobRow(
        id=job.id,
        tenant_id=job.tenant_id,
        document_id=job.document_id,
        external_id=document.external_id if document else None,
        title=document.title if document else None,
        version=job.version,
        state=job.state,
        attempts=job.attempts,
        error=job.error_message,
        error_stage=job.error_stage,
        stage_timings=job.stage_timings,
        created_at=job.created_at,
        finished_at=job.finished_at,
        lease_expires_at=job.lease_expires_at,
    )


# What can be done about a dead letter, by its source.
REMEDIES = {
    "job": "fix the cause (the error says it), then replay it: the job runs again with a "
    "fresh set of attempts",
    "outbox": "replay it once Elasticsearch accepts the write again (reconcile repairs it too)",
    "event": "not replayable: the upload was refused at intake; send a corrected upload (sync "
    "sends the file again once it changes), or discard the letter",
}


def dead_letter_view(letter: DeadLetter) -> DeadLetterView:
    return DeadLetterView(
        id=letter.id,
        tenant_id=letter.tenant_id,
        source=letter.source,
        ref=letter.ref,
        stage=letter.stage,
        error_class=letter.error_class,
        message=letter.message,
        attempts=letter.attempts,
        payload=letter.payload,
        created_at=letter.created_at,
        replayable=letter.source in ("job", "outbox"),
        remedy=REMEDIES.get(letter.source, "discard it once its cause is understood"),
    )
