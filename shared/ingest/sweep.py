"""The lease sweep: recovery from Postgres, never from Redis redelivery.

A running job whose lease expired lost its worker (kill -9, OOM, a lost host): a live worker
renews it every few seconds (shared/ingest/heartbeat.py). A queued job whose lease expired
has waited ``queued_republish_seconds`` since its message was published: the message was lost.
The sweep gives either a fresh lease and publishes the job again; a job that has used up its
attempts is dead-lettered with the last error it recorded.

Waiting out a queued job's lease (minutes) is too slow when Redis comes back empty: then the
ingest queue is empty while Postgres still has queued jobs published more than a sweep period
ago, and those are published again at once. A job whose message was only taken by a worker a
moment ago gets a second message, which finds it running: a no-op.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.db import UnitOfWork, unit_of_work
from shared.db import now as db_now
from shared.ingest import repository as repo
from shared.models import IngestJob, JobState
from shared.queue import INGEST_QUEUE, publish_ingest_job, queue_depths
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    republished: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)


def sweep_expired_jobs(settings: Settings | None = None, limit: int = 500) -> SweepReport:
    settings = settings or get_settings()
    report = SweepReport()
    with unit_of_work() as uow:
        session = uow.session
        now = db_now(session)
        for job in repo.expired_jobs(session, limit):
            if job.attempts >= settings.job_max_attempts:
                job.state = JobState.DEAD_LETTERED
                job.error_stage = job.error_stage or "lease"
                job.error_class = job.error_class or "LeaseExpired"
                job.error_message = (
                    f"gave up after {job.attempts} attempts; last error: "
                    f"{job.error_message or 'the worker disappeared while holding the lease'}"
                )
                job.finished_at = now
                job.lease_expires_at = None
                repo.add_dead_letter(
                    session,
                    tenant_id=job.tenant_id,
                    source="job",
                    ref=str(job.id),
                    stage=job.error_stage,
                    error_class=job.error_class,
                    message=job.error_message,
                    attempts=job.attempts,
                    payload={"document_id": str(job.document_id), "version": job.version},
                )
                report.dead_lettered.append(str(job.id))
                continue
            job.state = JobState.QUEUED
            report.republished.append(_publish_again(uow, job, now, settings))
    report.republished += _republish_lost_messages(settings, limit)
    if report.republished or report.dead_lettered:
        log.info(
            "sweep: republished %d, dead-lettered %d",
            len(report.republished),
            len(report.dead_lettered),
        )
    return report


def _republish_lost_messages(settings: Settings, limit: int) -> list[str]:
    try:
        if queue_depths()[INGEST_QUEUE] > 0:
            return []  # messages are waiting: queued jobs are just behind them
    except Exception:  # Redis down: nothing can be published now anyway
        return []
    republished = []
    with unit_of_work() as uow:
        session = uow.session
        now = db_now(session)
        stale = now - timedelta(seconds=settings.sweep_interval_seconds)
        for job in repo.queued_jobs_published_before(
            session, stale, settings.queued_republish_seconds, limit
        ):
            republished.append(_publish_again(uow, job, now, settings))
    return republished


def _publish_again(uow: UnitOfWork, job: IngestJob, now: datetime, settings: Settings) -> str:
    """A fresh lease, and the job's message again once the lease is committed."""
    repo.extend_lease(job, now, settings.queued_republish_seconds)
    uow.after_commit(functools.partial(publish_ingest_job, job.id))
    return str(job.id)
