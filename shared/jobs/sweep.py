"""The lease sweep: recovery from Postgres, never from Redis redelivery.

A running job whose lease expired lost its worker (kill -9, OOM, a lost host): a live worker
renews it every few seconds (shared/jobs/heartbeat.py). A queued job whose lease expired
has waited ``queued_republish_seconds`` since its message was published: the message was lost.
The sweep gives either a fresh lease and publishes the job again; a job that has used up its
attempts is dead-lettered with the last error it recorded. A running one lost its attempt with
its worker, which may have been killed by a batch-mate (shared/jobs/service.py,
``ISOLATE_AFTER_LOST_ATTEMPTS``): counted, so that a job that keeps losing them runs alone.

Waiting out a queued job's lease (minutes) is too slow when Redis comes back empty: then the
ingest queue is empty while Postgres still has queued jobs published more than a sweep period
ago, and those are published again at once. A job whose message was only taken by a worker a
moment ago gets a second message, which finds it running: a no-op.

Training jobs are acknowledged when they start (a run outlives the broker's visibility
timeout), so nothing redelivers them either. A running one whose heartbeat has been silent
for ``TRAINING_LOST_AFTER`` (a minute: six beats) lost its worker: it fails, with the reason
and its ``training.failed`` webhook. A queued one silent for ``TRAINING_MESSAGE_LOST_AFTER``
lost its message: it is published again (a duplicate is harmless, a run starts only from
``queued``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from shared.db import Transactions
from shared.db.repository import now
from shared.jobs import repository as repo
from shared.jobs import service as jobs
from shared.models import JobState
from shared.queue import INGEST_QUEUE, TaskQueue
from shared.settings import Settings, get_settings
from shared.webhooks import service as webhooks

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    republished: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    training_republished: list[str] = field(default_factory=list)
    training_failed: list[str] = field(default_factory=list)


# Since when this process's sweeps have run without a gap, on the database's clock. An outage
# of Postgres (or of Redis, or of this worker: whatever kept sweeps from running) silences
# every live training run's heartbeat too, so a run is judged lost only by a sweep that has
# itself run for TRAINING_LOST_AFTER without a gap longer than SWEEP_GAP: a live run has had
# its beats by then. The gap is longer than the relay queue's tasks that hold up its sweeps
# (a webhook run takes at most its 20 s budget and 5 s timeout); a longer one only delays
# the verdict.
_reachable_since: datetime | None = None
_last_sweep: datetime | None = None
SWEEP_GAP = timedelta(seconds=30)


def sweep_expired_jobs(
    transactions: Transactions,
    queue: TaskQueue,
    settings: Settings | None = None,
    limit: int = 500,
) -> SweepReport:
    """Two transactions: the jobs whose lease ran out (published again, or given up on), then
    the queued jobs whose message Redis lost; then the silent training jobs."""
    global _reachable_since
    try:
        return _sweep(transactions, queue, settings or get_settings(), limit)
    except SQLAlchemyError:
        _reachable_since = None  # the next sweep that reaches Postgres starts counting anew
        raise


def _sweep(
    transactions: Transactions, queue: TaskQueue, settings: Settings, limit: int
) -> SweepReport:
    global _reachable_since, _last_sweep
    report = SweepReport()
    with transactions() as uow:
        current = now(uow.session)
        if _reachable_since is None or _last_sweep is None or current - _last_sweep > SWEEP_GAP:
            _reachable_since = current
        _last_sweep = current
        for job in repo.expired_jobs(uow.session, limit):
            if job.state == JobState.RUNNING:
                jobs.lose_attempt(job)  # its worker was lost while it ran
            if job.attempts >= settings.job_max_attempts:
                jobs.give_up(uow, job, current, queue=queue)
                report.dead_lettered.append(str(job.id))
                continue
            job.state = JobState.QUEUED
            report.republished.append(jobs.publish_again(uow, job, current, settings, queue=queue))
    report.republished += _republish_lost_messages(transactions, queue, settings, limit)
    _settle_silent_training_jobs(transactions, queue, report, limit)
    if report.republished or report.dead_lettered:
        log.info(
            "sweep: republished %d, dead-lettered %d",
            len(report.republished),
            len(report.dead_lettered),
        )
    return report


def _settle_silent_training_jobs(
    transactions: Transactions, queue: TaskQueue, report: SweepReport, limit: int
) -> None:
    with transactions() as uow:
        current = now(uow.session)
        judged = (
            _reachable_since is not None and current - _reachable_since >= jobs.TRAINING_LOST_AFTER
        )
        for job in repo.silent_training_jobs(
            uow.session,
            current - jobs.TRAINING_LOST_AFTER if judged else None,
            current - jobs.TRAINING_MESSAGE_LOST_AFTER,
            limit,
        ):
            job.updated_at = current  # settled once per silence, not on every sweep
            if job.state == "queued":
                uow.after_commit(functools.partial(queue.publish_training_job, job.id))
                report.training_republished.append(str(job.id))
                continue
            job.state = "failed"
            job.error = (
                f"its worker stopped: no heartbeat for {jobs.TRAINING_LOST_AFTER.seconds} s "
                "(start the training again)"
            )
            webhooks.training_finished(uow, job, queue=queue)
            report.training_failed.append(str(job.id))
    if report.training_republished or report.training_failed:
        log.warning(
            "sweep: training jobs republished %s, failed (worker lost) %s",
            report.training_republished,
            report.training_failed,
        )


def _republish_lost_messages(
    transactions: Transactions, queue: TaskQueue, settings: Settings, limit: int
) -> list[str]:
    try:
        if queue.queue_depths()[INGEST_QUEUE] > 0:
            return []  # messages are waiting: queued jobs are just behind them
    except Exception:  # Redis down: nothing can be published now anyway
        return []
    with transactions() as uow:
        current = now(uow.session)
        stale = current - timedelta(seconds=settings.sweep_interval_seconds)
        return [
            jobs.publish_again(uow, job, current, settings, queue=queue)
            for job in repo.queued_jobs_published_before(
                uow.session, stale, settings.queued_republish_seconds, limit
            )
        ]
