"""Publishing to the Celery queues by task name, so the API and CLI never import worker code.

Publishing is best effort on purpose: the job row is already committed, and the lease sweep
re-publishes any job whose message never arrived, so a Redis outage delays work, never loses it.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import redis
from celery import Celery

from shared.redis_client import redis_client
from shared.settings import get_settings

log = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
RELAY_QUEUE = "relay"
MAINTENANCE_QUEUE = "maintenance"
# Webhook deliveries wait on receivers a tenant chose: a worker of their own, so that a
# receiver that hangs holds up no relay, sweep or other tenant's ingest.
WEBHOOKS_QUEUE = "webhooks"
TRAINING_QUEUE = "training"

PROCESS_JOB_TASK = "concord.ingest.process_job"
PROCESS_JOBS_TASK = "concord.ingest.process_jobs"
ACCEPT_EVENT_TASK = "concord.ingest.accept_upload_event"
ACCEPT_EVENTS_TASK = "concord.ingest.accept_upload_events"
RELAY_TASK = "concord.relay.drain_outbox"
WEBHOOKS_TASK = "concord.webhooks.deliver"
SWEEP_TASK = "concord.maintenance.sweep_expired_jobs"
RECONCILE_TASK = "concord.maintenance.reconcile"
PLACE_PARTITIONS_TASK = "concord.maintenance.place_tenant_partitions"
CALIBRATE_TASK = "concord.maintenance.calibrate_tenants"
CALIBRATE_SETTLED_TASK = "concord.maintenance.calibrate_settled_tenants"
TRAIN_RERANKER_TASK = "concord.training.train_reranker"


def broker_socket_options() -> dict[str, float]:
    """Socket timeouts for every connection to the broker: without them a Redis that accepts
    connections and then stays silent would hold an upload request (or a worker) forever."""
    settings = get_settings()
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
    }


@lru_cache
def get_producer() -> Celery:
    settings = get_settings()
    producer = Celery("concord-producer", broker=settings.redis_url(), set_as_current=False)
    producer.conf.broker_transport_options = broker_socket_options()
    producer.conf.broker_connection_timeout = settings.redis_socket_timeout_s
    return producer


def connect_producer() -> None:
    """Open the producer's broker connection and build what publishing builds on first use
    (the API's warm-up: otherwise the first upload after start-up pays for it)."""
    producer = get_producer()
    producer.amqp.router  # noqa: B018  (built on first access)
    with producer.producer_or_acquire() as publisher:
        publisher.connection.ensure_connection(max_retries=1)


def _send(name: str, args: list[Any], queue: str) -> bool:
    try:
        get_producer().send_task(
            name,
            args=args,
            queue=queue,
            # One quick retry for a blip; a longer outage must not hold the request that
            # publishes (an upload): the sweep republishes from Postgres once Redis is back.
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.1, "interval_max": 0.5},
        )
        return True
    except Exception as e:  # kombu/redis raise many types; the sweep is the safety net
        log.warning(
            "could not publish %s (%s: %s); the lease sweep will recover it",
            name,
            type(e).__name__,
            e,
        )
        return False


def publish_ingest_job(job_id: uuid.UUID) -> bool:
    return _send(PROCESS_JOB_TASK, [str(job_id)], INGEST_QUEUE)


def publish_ingest_jobs(job_ids: Sequence[uuid.UUID]) -> bool:
    """One message for jobs accepted together, processed as one batch."""
    return _send(PROCESS_JOBS_TASK, [[str(j) for j in job_ids]], INGEST_QUEUE)


RELAY_PENDING_KEY = "concord:relay-pending"


def publish_training_job(job_id: uuid.UUID) -> None:
    """Unlike ingest there is no sweep behind this: a failure to publish must surface."""
    get_producer().send_task(TRAIN_RERANKER_TASK, args=[str(job_id)], queue=TRAINING_QUEUE)


def publish_relay() -> bool:
    """Ask for an outbox drain now, unless one is asked for and has not started yet: that one
    claims the rows of this commit too (see _publish_debounced)."""
    return _publish_debounced(RELAY_PENDING_KEY, RELAY_TASK, RELAY_QUEUE)


def relay_started() -> None:
    """A drain starts: a commit from now on asks for another one."""
    _request_taken(RELAY_PENDING_KEY)


WEBHOOKS_PENDING_KEY = "concord:webhooks-pending"


def publish_webhooks() -> bool:
    """Ask for the due webhook deliveries to be sent now (debounced as the relay is; beat
    sends them periodically anyway)."""
    return _publish_debounced(WEBHOOKS_PENDING_KEY, WEBHOOKS_TASK, WEBHOOKS_QUEUE)


def webhooks_started() -> None:
    """A delivery run starts: a commit from now on asks for another one."""
    _request_taken(WEBHOOKS_PENDING_KEY)


CALIBRATE_PENDING_KEY = "concord:calibrate-pending"


def publish_calibration() -> bool:
    """Ask for the calibration of tenants whose ingest has settled (debounced as the relay
    is: one request waits at most, however many batches commit meanwhile)."""
    return _publish_debounced(CALIBRATE_PENDING_KEY, CALIBRATE_SETTLED_TASK, TRAINING_QUEUE)


def calibration_started() -> None:
    """A calibration run starts: a batch written from now on asks for another one."""
    _request_taken(CALIBRATE_PENDING_KEY)


# How long a request that never started (its message lost) keeps others from being sent;
# beat's periodic run covers that time.
PENDING_REQUEST_TTL_S = 10


def _publish_debounced(pending_key: str, task: str, queue: str) -> bool:
    """``task`` on ``queue``, unless one is already waiting (``pending_key`` marks it
    from when it is sent until its run starts, see _request_taken). Whatever committed
    before that start is the waiting run's, so one message waits (one more each
    PENDING_REQUEST_TTL_S while the relay worker is busy elsewhere) and a busy ingest does
    not flood the queue; and a commit does not wait for beat, as one did when a request a
    second was sent at most (the last batch of a burst waited up to relay_interval_seconds
    before Elasticsearch had it). Only where Redis fails do rows wait for beat."""
    try:
        if not _redis().set(pending_key, "1", nx=True, ex=PENDING_REQUEST_TTL_S):
            return True
    except redis.RedisError:
        return False  # the broker is the same Redis: publishing would fail too
    sent = _send(task, [], queue)
    if not sent:
        _request_taken(pending_key)  # nothing waits: the next commit asks again
    return sent


def _request_taken(pending_key: str) -> None:
    """A run starts before it reads what is due: a commit after this asks for a run of its
    own, whose rows this one may not see."""
    with contextlib.suppress(redis.RedisError):  # the key expires; beat runs meanwhile
        _redis().delete(pending_key)


def publish_upload_event(event: dict[str, Any]) -> None:
    """Producers publish upload events; failures here must surface."""
    get_producer().send_task(ACCEPT_EVENT_TASK, args=[event], queue=INGEST_QUEUE)


def publish_upload_events(events: list[dict[str, Any]]) -> None:
    """Many upload events in one message (what `concord ingest` sends): accepted in one
    transaction and processed as one batch, instead of two messages and a transaction each."""
    get_producer().send_task(ACCEPT_EVENTS_TASK, args=[events], queue=INGEST_QUEUE)


def queue_depths() -> dict[str, int]:
    """Messages waiting per queue (Celery's Redis transport keeps each queue as a list)."""
    client = _redis()
    queues = (INGEST_QUEUE, RELAY_QUEUE, MAINTENANCE_QUEUE, TRAINING_QUEUE, WEBHOOKS_QUEUE)
    return {q: int(client.llen(q)) for q in queues}


def _redis() -> redis.Redis:
    # One bounded try: callers fall back (the sweep, beat).
    return redis_client(get_settings().redis_socket_timeout_s)
