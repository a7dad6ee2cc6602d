"""The task queue: publishing to the Celery queues by task name, so the API and CLI never
import worker code.

Services publish through the ``TaskQueue`` port, which the composition roots hand them in
their ``Stores`` (shared/stores/compose.py): ``CeleryQueue`` here (Celery's Redis transport),
or ``MemoryQueue`` (shared/stores/memory/queue.py) in the unit tier. Both pass the same
contract (tests/contract/test_queue.py). Producers outside Concord's processes publish upload
events with :func:`publish_upload_event` and :func:`publish_upload_events`.

Publishing is best effort on purpose: the job row is already committed, and the lease sweep
re-publishes any job whose message never arrived, so a Redis outage delays work, never loses it.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

import kombu.exceptions
import redis
from celery import Celery

from shared.redis_client import new_redis_client
from shared.settings import Settings, get_settings
from shared.stores.driver_errors import broker_error, translating

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


def broker_socket_options(settings: Settings | None = None) -> dict[str, float]:
    """Socket timeouts for every connection to the broker: without them a Redis that accepts
    connections and then stays silent would hold an upload request (or a worker) forever."""
    settings = settings or get_settings()
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_socket_timeout_s,
    }


QUEUES = (INGEST_QUEUE, RELAY_QUEUE, MAINTENANCE_QUEUE, TRAINING_QUEUE, WEBHOOKS_QUEUE)

RELAY_PENDING_KEY = "concord:relay-pending"
WEBHOOKS_PENDING_KEY = "concord:webhooks-pending"
CALIBRATE_PENDING_KEY = "concord:calibrate-pending"
# How long a request that never started (its message lost) keeps others from being sent;
# beat's periodic run covers that time.
PENDING_REQUEST_TTL_S = 10


class TaskQueue(Protocol):
    """What services ask of the task queue. Publishing an ingest job or a run is best effort
    (False when it failed: the sweep or beat recovers it); a training job and upload events
    must reach the queue (it raises)."""

    def publish_ingest_job(self, job_id: uuid.UUID) -> bool: ...
    def publish_ingest_jobs(self, job_ids: Sequence[uuid.UUID]) -> bool: ...
    def publish_training_job(self, job_id: uuid.UUID) -> None: ...
    def publish_upload_events(self, events: list[dict[str, Any]]) -> None: ...
    # Debounced requests for a run: one waits at a time; the run's start (``*_started``)
    # lets the next commit ask for another.
    def publish_relay(self) -> bool: ...
    def relay_started(self) -> None: ...
    def publish_webhooks(self) -> bool: ...
    def webhooks_started(self) -> None: ...
    def publish_calibration(self) -> bool: ...
    def calibration_started(self) -> None: ...
    def queue_depths(self) -> dict[str, int]: ...
    def warm_up(self) -> None: ...


def _make_producer(settings: Settings) -> Celery:
    producer = Celery("concord-producer", broker=settings.redis_url(), set_as_current=False)
    producer.conf.broker_transport_options = broker_socket_options(settings)
    producer.conf.broker_connection_timeout = settings.redis_socket_timeout_s
    return producer


@lru_cache
def get_producer() -> Celery:
    """The producer of this process's configured broker (for :func:`publish_upload_event`)."""
    return _make_producer(get_settings())


def _send(producer: Celery, name: str, args: list[Any], queue: str) -> bool:
    try:
        producer.send_task(
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


@translating((redis.RedisError, kombu.exceptions.OperationalError), broker_error)
class CeleryQueue:
    """TaskQueue on Celery's Redis transport (each queue a Redis list), for ``settings``'
    Redis; its producer and client are made on first use. What must surface (a training job,
    upload events, the depths) raises StoreUnavailable when Redis does not answer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producer: Celery | None = None
        self._client: redis.Redis | None = None

    def warm_up(self) -> None:
        """Open the producer's broker connection and build what publishing builds on first
        use (the API's warm-up: otherwise the first upload after start-up pays for it)."""
        producer = self._celery()
        producer.amqp.router  # noqa: B018  (built on first access)
        with producer.producer_or_acquire() as publisher:
            publisher.connection.ensure_connection(max_retries=1)

    def publish_ingest_job(self, job_id: uuid.UUID) -> bool:
        return _send(self._celery(), PROCESS_JOB_TASK, [str(job_id)], INGEST_QUEUE)

    def publish_ingest_jobs(self, job_ids: Sequence[uuid.UUID]) -> bool:
        """One message for jobs accepted together, processed as one batch."""
        return _send(self._celery(), PROCESS_JOBS_TASK, [[str(j) for j in job_ids]], INGEST_QUEUE)

    def publish_training_job(self, job_id: uuid.UUID) -> None:
        """Unlike ingest there is no sweep behind this: a failure to publish must surface."""
        self._celery().send_task(TRAIN_RERANKER_TASK, args=[str(job_id)], queue=TRAINING_QUEUE)

    def publish_upload_events(self, events: list[dict[str, Any]]) -> None:
        """Many upload events in one message (what `concord ingest` sends): accepted in one
        transaction and processed as one batch; a failure must surface."""
        self._celery().send_task(ACCEPT_EVENTS_TASK, args=[events], queue=INGEST_QUEUE)

    def publish_relay(self) -> bool:
        """Ask for an outbox drain now, unless one is asked for and has not started yet:
        that one claims the rows of this commit too (see _publish_debounced)."""
        return self._publish_debounced(RELAY_PENDING_KEY, RELAY_TASK, RELAY_QUEUE)

    def relay_started(self) -> None:
        """A drain starts: a commit from now on asks for another one."""
        self._request_taken(RELAY_PENDING_KEY)

    def publish_webhooks(self) -> bool:
        """Ask for the due webhook deliveries to be sent now (debounced as the relay is;
        beat sends them periodically anyway)."""
        return self._publish_debounced(WEBHOOKS_PENDING_KEY, WEBHOOKS_TASK, WEBHOOKS_QUEUE)

    def webhooks_started(self) -> None:
        self._request_taken(WEBHOOKS_PENDING_KEY)

    def publish_calibration(self) -> bool:
        """Ask for the calibration of tenants whose ingest has settled (debounced as the
        relay is: one request waits at most, however many batches commit meanwhile)."""
        return self._publish_debounced(
            CALIBRATE_PENDING_KEY, CALIBRATE_SETTLED_TASK, TRAINING_QUEUE
        )

    def calibration_started(self) -> None:
        self._request_taken(CALIBRATE_PENDING_KEY)

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting per queue (Celery's Redis transport keeps each queue as a list)."""
        client = self._redis()
        return {q: int(client.llen(q)) for q in QUEUES}

    def _publish_debounced(self, pending_key: str, task: str, queue: str) -> bool:
        """``task`` on ``queue``, unless one is already waiting (``pending_key`` marks it
        from when it is sent until its run starts, see _request_taken). Whatever committed
        before that start is the waiting run's, so one message waits (one more each
        PENDING_REQUEST_TTL_S while the relay worker is busy elsewhere) and a busy ingest
        does not flood the queue; and a commit does not wait for beat, as one did when a
        request a second was sent at most (the last batch of a burst waited up to
        relay_interval_seconds before Elasticsearch had it). Only where Redis fails do rows
        wait for beat."""
        try:
            if not self._redis().set(pending_key, "1", nx=True, ex=PENDING_REQUEST_TTL_S):
                return True
        except redis.RedisError:
            return False  # the broker is the same Redis: publishing would fail too
        sent = _send(self._celery(), task, [], queue)
        if not sent:
            self._request_taken(pending_key)  # nothing waits: the next commit asks again
        return sent

    def _request_taken(self, pending_key: str) -> None:
        """A run starts before it reads what is due: a commit after this asks for a run of
        its own, whose rows this one may not see."""
        with contextlib.suppress(redis.RedisError):  # the key expires; beat runs meanwhile
            self._redis().delete(pending_key)

    def _celery(self) -> Celery:
        if self._producer is None:
            self._producer = _make_producer(self.settings)
        return self._producer

    def _redis(self) -> redis.Redis:
        # One bounded try: callers fall back (the sweep, beat).
        if self._client is None:
            self._client = new_redis_client(self.settings, self.settings.redis_socket_timeout_s)
        return self._client


def publish_upload_event(event: dict[str, Any]) -> None:
    """For producers: an upload event on this process's configured queue (failures
    surface)."""
    get_producer().send_task(ACCEPT_EVENT_TASK, args=[event], queue=INGEST_QUEUE)


def publish_upload_events(events: list[dict[str, Any]]) -> None:
    """For producers: many upload events in one message, accepted in one transaction."""
    get_producer().send_task(ACCEPT_EVENTS_TASK, args=[events], queue=INGEST_QUEUE)
