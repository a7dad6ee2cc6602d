"""Thin tasks: take ids, hand off to a pipeline step, decide retry or failure."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from celery import Task

from shared.ingest import pipeline, relay, sweep
from shared.ingest.service import reject_upload_event
from shared.ingest.upload_event import EventsOutcome
from shared.ingest.upload_event import accept_upload_events as accept_events_together
from shared.logs import job_context
from shared.queue import (
    ACCEPT_EVENT_TASK,
    ACCEPT_EVENTS_TASK,
    INGEST_QUEUE,
    MAINTENANCE_QUEUE,
    PROCESS_JOB_TASK,
    PROCESS_JOBS_TASK,
    RECONCILE_TASK,
    RELAY_QUEUE,
    RELAY_TASK,
    SWEEP_TASK,
    TRAIN_RERANKER_TASK,
    TRAINING_QUEUE,
)
from shared.reconcile.service import reconcile
from shared.settings import get_settings
from workers.base import concord_task, retry_if_retriable

log = logging.getLogger(__name__)


@concord_task(PROCESS_JOB_TASK, INGEST_QUEUE)
def process_job(self: Task, job_id: str) -> dict[str, Any]:
    try:
        with job_context(job_id, None):
            outcome = pipeline.process_job(uuid.UUID(job_id))
    except Exception as e:
        retry_if_retriable(self, e)
        pipeline.record_failure(uuid.UUID(job_id), e)
        raise
    return {"job_id": outcome.job_id, "state": str(outcome.state), **outcome.detail}


@concord_task(PROCESS_JOBS_TASK, INGEST_QUEUE, max_retries=0)
def process_jobs(self: Task, job_ids: list[str]) -> dict[str, Any]:
    """Jobs accepted together, as one batch. Not retried as a whole: on failure each job is
    back in the queue with its own ``process_job`` message (see pipeline.process_jobs)."""
    outcomes = pipeline.process_jobs([uuid.UUID(j) for j in job_ids])
    return {"jobs": len(job_ids), "states": dict(Counter(o.state for o in outcomes.values()))}


@concord_task(ACCEPT_EVENTS_TASK, INGEST_QUEUE)
def accept_upload_events(self: Task, events: list[Any]) -> dict[str, int]:
    """Many upload events in one message (``concord ingest`` sends these)."""
    return _accept_events(self, events if isinstance(events, list) else [events]).counts()


@concord_task(ACCEPT_EVENT_TASK, INGEST_QUEUE)
def accept_upload_event(self: Task, event: Any) -> dict[str, Any]:
    """Intake for producers that publish one upload event per message: the same path as a
    list of them, so an event that can never be accepted is dead-lettered, never dropped."""
    outcome = _accept_events(self, [event])
    status = "accepted" if outcome.accepted else "unchanged" if outcome.unchanged else "rejected"
    return {"status": status, "job_id": str(outcome.job_ids[0]) if outcome.job_ids else None}


def _accept_events(task: Task, events: list[Any]) -> EventsOutcome:
    """Accept a message's events in one transaction. If that fails for a reason a retry will
    not fix, the events are accepted one at a time instead, so that one bad event cannot take
    its neighbours down, and each one that still fails is dead-lettered with its reason (also
    once a retriable failure has used up the task's retries). A retry of the whole message is
    safe: events already accepted come back ``unchanged``."""
    settings = get_settings()
    try:
        return accept_events_together(events, settings)
    except Exception as e:
        retry_if_retriable(task, e)
        log.warning("accepting %s events together failed (%s); one at a time", len(events), e)
    outcome = EventsOutcome()
    for event in events:
        try:
            outcome.add(accept_events_together([event], settings))
        except Exception as e:
            retry_if_retriable(task, e)
            reject_upload_event(event if isinstance(event, dict) else {"event": repr(event)}, e)
            outcome.rejected += 1
    return outcome


@concord_task(RELAY_TASK, RELAY_QUEUE, max_retries=0)
def drain_outbox(self: Task) -> dict[str, Any]:
    report = relay.drain()
    return vars(report)


@concord_task(RECONCILE_TASK, MAINTENANCE_QUEUE, max_retries=0)
def reconcile_all(self: Task) -> dict[str, Any]:
    """Periodic: compare every tenant and queue repairs (the relay applies them)."""
    return reconcile(repair=True).as_dict()


@concord_task(SWEEP_TASK, MAINTENANCE_QUEUE, max_retries=0)
def sweep_expired_jobs(self: Task) -> dict[str, Any]:
    report = sweep.sweep_expired_jobs()
    return vars(report)


@concord_task(TRAIN_RERANKER_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def train_reranker(self: Task, job_id: str) -> dict[str, Any]:
    """A background ``concord reranker train`` (state and progress in ``training_jobs``)."""
    from training.jobs import run_training_job

    with job_context(job_id, None):
        return run_training_job(uuid.UUID(job_id))
