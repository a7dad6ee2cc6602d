"""Thin tasks: take ids, hand the boundary's transactions (``unit_of_work``) to a service,
and say on the decorator which errors they retry and what they do once they give up."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

import kombu.exceptions
from celery import Task
from redis.exceptions import RedisError

from shared.db import unit_of_work
from shared.documents import events as upload_events
from shared.documents.events import EventsOutcome
from shared.documents.service import add_event_dead_letter
from shared.errors import StoreUnavailable
from shared.ingest import pipeline
from shared.jobs import service as jobs
from shared.jobs import sweep
from shared.logs import job_context
from shared.queue import (
    ACCEPT_EVENT_TASK,
    ACCEPT_EVENTS_TASK,
    CALIBRATE_SETTLED_TASK,
    CALIBRATE_TASK,
    INGEST_QUEUE,
    MAINTENANCE_QUEUE,
    PLACE_PARTITIONS_TASK,
    PROCESS_JOB_TASK,
    PROCESS_JOBS_TASK,
    RECONCILE_TASK,
    RELAY_QUEUE,
    RELAY_TASK,
    SWEEP_TASK,
    TRAIN_RERANKER_TASK,
    TRAINING_QUEUE,
    WEBHOOKS_QUEUE,
    WEBHOOKS_TASK,
)
from shared.reconcile.service import periodic_reconcile
from shared.redis_client import redis_client
from shared.relay import service as relay
from shared.retry import describe_error, is_retriable
from shared.search import calibration
from shared.settings import get_settings
from shared.stores import partitions
from shared.webhooks import delivery as webhook_delivery
from workers import deliveries
from workers.base import concord_task, retry_if_retriable
from workers.stores import worker_stores

log = logging.getLogger(__name__)


def _dead_letter_job(task: Task, error: Exception, job_id: str) -> None:
    """The job's retries are spent, or its error is not one a retry fixes."""
    with unit_of_work() as uow:
        jobs.record_failure(uow, uuid.UUID(job_id), error, queue=worker_stores().queue)
    raise error


@concord_task(PROCESS_JOB_TASK, INGEST_QUEUE, retry_on=is_retriable, give_up=_dead_letter_job)
def process_job(self: Task, job_id: str) -> dict[str, Any]:
    """claim → parse → chunk → embed → write (shared/ingest/pipeline.process_job)."""
    with job_context(job_id, None):
        return pipeline.process_job(worker_stores(), unit_of_work, uuid.UUID(job_id)).as_dict()


@concord_task(PROCESS_JOBS_TASK, INGEST_QUEUE, max_retries=0)
def process_jobs(self: Task, job_ids: list[str]) -> dict[str, Any]:
    """Jobs accepted together, as one batch. Not retried as a whole: on failure each job is
    back in the queue with its own ``process_job`` message (see pipeline.run)."""
    outcomes = pipeline.process_jobs(worker_stores(), unit_of_work, [uuid.UUID(j) for j in job_ids])
    return {"jobs": len(job_ids), "states": dict(Counter(o.state for o in outcomes.values()))}


def _events(message: Any) -> list[Any]:
    return message if isinstance(message, list) else [message]


def _accept_together(events: list[Any]) -> EventsOutcome:
    with unit_of_work() as uow:
        return upload_events.accept_upload_events(worker_stores(), uow, events, get_settings())


def _accept_one_at_a_time(task: Task, error: Exception, events: Any) -> EventsOutcome:
    """Accepting a message's events in one transaction failed for good: they are accepted one
    at a time instead, so that one bad event cannot take its neighbours down, and each one
    that still fails is dead-lettered with its reason (also once a retriable failure has used
    up the task's retries). A retry of the whole message is safe: events already accepted
    come back ``unchanged``."""
    listed = _events(events)
    log.warning("accepting %s events together failed (%s); one at a time", len(listed), error)
    outcome = EventsOutcome()
    for event in listed:
        try:
            outcome.add(_accept_together([event]))
        except Exception as e:
            retry_if_retriable(task, e)
            _dead_letter_event(task, event, e)
            outcome.rejected += 1
    return outcome


def _dead_letter_event(task: Task, event: Any, error: Exception) -> None:
    """The refused event's dead letter. Should the database refuse even that (for a reason a
    retry will not fix), a letter that names only the error, and should that fail too, a log
    line: the message's other events (any tenant's) are accepted whatever one event holds."""
    recorded = event if isinstance(event, dict) else {"event": repr(event)[:1000]}
    # its tenant and external id, where they are text, so the tenant still sees the letter
    named = {k: recorded.get(k) for k in ("tenant_id", "external_id")}
    unrecorded = {k: v for k, v in named.items() if isinstance(v, str)}
    unrecorded["unrecorded"] = "the event itself could not be recorded"
    for letter in (recorded, unrecorded):
        try:
            with unit_of_work() as uow:
                add_event_dead_letter(uow.session, letter, error)
            return
        except Exception as e:
            retry_if_retriable(task, e)
            log.error("could not record a refused event's dead letter: %s", describe_error(e))


# The give_up hooks take the task's own parameter names: a message may pass them by name.
def _counts(task: Task, error: Exception, events: Any) -> dict[str, int]:
    return _accept_one_at_a_time(task, error, events).counts()


@concord_task(ACCEPT_EVENTS_TASK, INGEST_QUEUE, retry_on=is_retriable, give_up=_counts)
def accept_upload_events(self: Task, events: list[Any]) -> dict[str, int]:
    """Many upload events in one message (``concord ingest`` sends these), accepted in order
    :data:`EVENTS_PER_MESSAGE` at a time, each slice in a transaction of its own: an event
    that names a file has it read whole before its slice is accepted, so a producer that put
    thousands in one message (the CLI's batcher never does) would otherwise have every file
    in memory at once. A slice that fails after others committed goes on, with the rest, as
    a message of its own (its own retries, its own one-at-a-time fallback): a retry of this
    one would apply the committed slices again (an upsert a later delete had removed
    would come back, if only for a moment)."""
    listed = _events(events)
    per_slice = upload_events.EVENTS_PER_MESSAGE
    outcome = EventsOutcome()
    for start in range(0, len(listed), per_slice):
        try:
            outcome.add(_accept_together(listed[start : start + per_slice]))
        except Exception as e:
            if start == 0:
                raise  # nothing committed yet: this message's retry or fallback has it all
            log.warning("events %d.. of a message go on in a message of their own: %s", start, e)
            try:
                worker_stores().queue.publish_upload_events(listed[start:])
            except StoreUnavailable as unpublished:
                # Not this message's retry (it would apply the committed slices again): the
                # give-up path accepts every event one at a time, the committed ones as
                # ``unchanged``.
                raise RestNotPublished(f"events {start}.. could not be published") from unpublished
            break
    return outcome.counts()


class RestNotPublished(Exception):
    """The events after a failed slice could not go on in a message of their own; not
    retriable (see accept_upload_events)."""


def _status(outcome: EventsOutcome) -> dict[str, Any]:
    counts = outcome.counts()
    status = next((s for s in ("accepted", "deleted", "unchanged") if counts[s]), "rejected")
    return {"status": status, "job_id": str(outcome.job_ids[0]) if outcome.job_ids else None}


def _single_status(task: Task, error: Exception, event: Any) -> dict[str, Any]:
    return _status(_accept_one_at_a_time(task, error, [event]))


@concord_task(ACCEPT_EVENT_TASK, INGEST_QUEUE, retry_on=is_retriable, give_up=_single_status)
def accept_upload_event(self: Task, event: Any) -> dict[str, Any]:
    """Intake for producers that publish one upload event per message: the same path as a
    list of them, so an event that can never be accepted is dead-lettered, never dropped."""
    return _status(_accept_together([event]))


@concord_task(RELAY_TASK, RELAY_QUEUE, max_retries=0)
def drain_outbox(self: Task) -> dict[str, Any]:
    stores = worker_stores()
    stores.queue.relay_started()  # before the drain claims rows: later commits ask again
    return vars(relay.drain(stores, unit_of_work))


@concord_task(WEBHOOKS_TASK, WEBHOOKS_QUEUE, max_retries=0)
def deliver_webhooks(self: Task) -> dict[str, Any]:
    """Send the webhook deliveries that are due (after a commit that made some, and on beat:
    retries come due there)."""
    worker_stores().queue.webhooks_started()
    return webhook_delivery.deliver_due(unit_of_work, get_settings()).as_dict()


@concord_task(RECONCILE_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def reconcile_all(self: Task) -> dict[str, Any]:
    """Periodic: compare every tenant and queue repairs (the relay applies them). Its time
    grows with tenants and chunks, so it runs where placement does, not on the maintenance
    queue: the relay worker's one process would hold the sweep (a dead worker's jobs) and
    the outbox relay behind it, and the task time limit would cut it before the last
    tenants. It is acknowledged on start: a run lost with its worker is the next one's."""
    return periodic_reconcile(worker_stores(), unit_of_work)


@concord_task(CALIBRATE_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def calibrate_tenants(self: Task) -> dict[str, Any]:
    """Periodic: the decision threshold of each tenant whose corpus is new or has changed
    (shared/search/calibration.py)."""
    done = calibration.calibrate_due(worker_stores(), unit_of_work, get_settings())
    return {"calibrated": {c.tenant_id: c.min_score for c in done}}


@concord_task(CALIBRATE_SETTLED_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def calibrate_settled_tenants(self: Task) -> dict[str, Any]:
    """After an ingest batch: the threshold of each tenant whose ingest has settled and whose
    corpus is new or has changed, without waiting for beat."""
    stores = worker_stores()
    stores.queue.calibration_started()  # a batch written from now on asks for a run of its own
    done = calibration.calibrate_due(stores, unit_of_work, get_settings(), settled_only=True)
    return {"calibrated": {c.tenant_id: c.min_score for c in done}}


@concord_task(PLACE_PARTITIONS_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def place_tenant_partitions(self: Task) -> dict[str, Any]:
    """Periodic: a partition and HNSW graph of its own for each tenant past the threshold."""
    return partitions.place_tenants(unit_of_work).as_dict()


@concord_task(SWEEP_TASK, MAINTENANCE_QUEUE, max_retries=0)
def sweep_expired_jobs(self: Task) -> dict[str, Any]:
    """Jobs whose lease ran out (shared/jobs/sweep.py), and messages a dead worker's main
    process was holding (workers/deliveries.py): each whatever became of the other."""
    try:
        return vars(sweep.sweep_expired_jobs(unit_of_work, worker_stores().queue))
    finally:
        _hand_back_orphaned_messages(self)


def _hand_back_orphaned_messages(task: Task) -> None:
    try:
        deliveries.restore_orphaned(task.app, redis_client(get_settings().redis_socket_timeout_s))
    except (RedisError, kombu.exceptions.OperationalError) as e:  # the next sweep tries again
        log.warning("orphaned messages not handed back: %s", e)


@concord_task(TRAIN_RERANKER_TASK, TRAINING_QUEUE, max_retries=0, long_running=True)
def train_reranker(self: Task, job_id: str) -> dict[str, Any]:
    """A background ``concord reranker train`` (state and progress in ``training_jobs``)."""
    from training.jobs import run_training_job

    with job_context(job_id, None):
        return run_training_job(uuid.UUID(job_id), queue=worker_stores().queue)
