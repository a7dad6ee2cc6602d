"""The Celery application: durable settings, queues, and the beat schedule.

Durability comes from Postgres (job leases and the outbox); these settings make Redis delivery
as safe as it can be: acks after the work is done, redelivery when a worker dies, one message
prefetched at a time, and task time limits below the broker's visibility timeout.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery
from celery.signals import (
    celeryd_after_setup,
    setup_logging,
    task_received,
    worker_process_init,
    worker_ready,
)
from kombu.connection import Connection

from shared.logs import configure_json_logging
from shared.queue import (
    CALIBRATE_TASK,
    INGEST_QUEUE,
    MAINTENANCE_QUEUE,
    PLACE_PARTITIONS_TASK,
    RECONCILE_TASK,
    RELAY_QUEUE,
    RELAY_TASK,
    SWEEP_TASK,
    TRAINING_QUEUE,
    WEBHOOKS_QUEUE,
    WEBHOOKS_TASK,
    broker_socket_options,
)
from shared.settings import Settings, get_settings
from workers import deliveries


def create_celery_app() -> Celery:
    settings = get_settings()
    app = Celery("concord", broker=settings.redis_url(), include=["workers.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_time_limit_s,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            **broker_socket_options(),
        },
        broker_connection_timeout=settings.redis_socket_timeout_s,
        broker_connection_retry_on_startup=True,
        # Never give up on the broker: after Celery's default 100 attempts a worker exits and
        # whatever Redis outage outlasted them becomes an outage of the whole pipeline.
        broker_connection_max_retries=None,
        # A new pool child loads the embedding model before it reports up; on two busy cores
        # that takes well over Celery's default 4 s, and a child killed for being slow is
        # replaced by another that is just as slow, for ever.
        worker_proc_alive_timeout=settings.worker_start_timeout_s,
        task_default_queue=INGEST_QUEUE,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        beat_schedule=beat_schedule(settings),
    )
    return app


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's periodic tasks, each on its queue, each message expiring when the next is due
    (a backlog of them would only repeat the same work)."""
    return {
        "sweep-expired-jobs": {
            "task": SWEEP_TASK,
            "schedule": settings.sweep_interval_seconds,
            "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.sweep_interval_seconds},
        },
        "reconcile": {
            "task": RECONCILE_TASK,
            "schedule": settings.reconcile_interval_seconds or 10**9,
            # Not the maintenance queue either: its time grows with the corpus.
            "options": {
                "queue": TRAINING_QUEUE,
                "expires": settings.reconcile_interval_seconds or None,
            },
        },
        "calibrate-tenants": {
            "task": CALIBRATE_TASK,
            "schedule": settings.calibrate_interval_seconds,
            # with the model work: it encodes a few hundred questions per tenant
            "options": {
                "queue": TRAINING_QUEUE,
                "expires": settings.calibrate_interval_seconds,
            },
        },
        "place-tenant-partitions": {
            "task": PLACE_PARTITIONS_TASK,
            "schedule": settings.partition_interval_seconds,
            # Not the maintenance queue: a graph build would hold up its sweeps.
            "options": {
                "queue": TRAINING_QUEUE,
                "expires": settings.partition_interval_seconds,
            },
        },
        "drain-outbox": {
            "task": RELAY_TASK,
            "schedule": settings.relay_interval_seconds,
            "options": {"queue": RELAY_QUEUE, "expires": settings.relay_interval_seconds * 2},
        },
        "deliver-webhooks": {
            "task": WEBHOOKS_TASK,
            "schedule": settings.webhook_interval_seconds,
            "options": {
                "queue": WEBHOOKS_QUEUE,
                "expires": settings.webhook_interval_seconds * 2,
            },
        },
    }


def cap_reconnect_backoff(max_interval_s: float) -> None:
    """Kombu waits 2, 4, 6, ... up to 30 s between attempts to reach a lost broker, and Celery
    passes no way to change that; after a minute without Redis a worker (or beat) would sit
    idle for many seconds after Redis is back. Cap the wait, so recovery starts within a
    sweep period."""
    original = Connection._ensure_connection

    def ensure(
        self: Connection,
        errback: Any = None,
        max_retries: int | None = None,
        interval_start: float = 2,
        interval_step: float = 2,
        interval_max: float = 30,
        **kwargs: Any,
    ) -> Any:
        return original(  # type: ignore[no-untyped-call]
            self,
            errback,
            max_retries,
            min(interval_start, max_interval_s),
            min(interval_step, max_interval_s),
            min(interval_max, max_interval_s),
            **kwargs,
        )

    Connection._ensure_connection = ensure  # type: ignore[method-assign,assignment]


celery_app = create_celery_app()
cap_reconnect_backoff(get_settings().broker_reconnect_max_interval_s)


@setup_logging.connect  # type: ignore[untyped-decorator]
def _json_logs(**_: Any) -> None:
    """Connected, this replaces Celery's own log set-up: JSON lines with job/request ids."""
    configure_json_logging()


# Whether this worker takes CPU-bound work (embedding, training): decided in the parent once
# its queues are known, and inherited by the pool's processes. A worker of only the relay and
# maintenance queues neither loads the model nor sizes torch's threads.
_takes_model_work = True


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]
def _note_queues(instance: Any, **_: Any) -> None:
    global _takes_model_work
    consumed = set(instance.app.amqp.queues.consume_from)
    _takes_model_work = bool(consumed & {INGEST_QUEUE, TRAINING_QUEUE})


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _init_worker_process(**_: Any) -> None:
    """Per child process, after fork: fresh connections and, in a worker that embeds, a fair
    share of the CPU for torch and the model loaded (its dimension checked against the
    schema) before the first task."""
    import os

    from shared.db import dispose_engine_after_fork

    dispose_engine_after_fork()
    if not _takes_model_work:
        return

    import torch

    from shared.ingest.embedding import get_embedder, torch_threads_per_process

    processes = celery_app.conf.worker_concurrency or os.cpu_count() or 1
    torch.set_num_threads(torch_threads_per_process(get_settings(), processes))
    get_embedder().model()
    get_embedder().passage_encoder()  # ONNX (exported and quantized once) when configured


# Who holds which message (workers/deliveries.py): the main process records each message it
# receives under this start's own id and keeps the id's alive key fresh, so the sweep can
# hand back at once what a dead worker's main process was holding.
_alive = threading.Event()
_holder: str | None = None


def _this_holder(name: str) -> str:
    global _holder
    if _holder is None:
        _holder = deliveries.worker_id(name)
    return _holder


@worker_ready.connect  # type: ignore[untyped-decorator]
def _keep_worker_alive(sender: Any, **_: Any) -> None:
    deliveries.keep_alive(_delivery_redis(), _this_holder(sender.hostname), _alive)


@task_received.connect  # type: ignore[untyped-decorator]
def _record_delivery(sender: Any, request: Any, **_: Any) -> None:
    deliveries.record_delivery(
        _delivery_redis(), _this_holder(sender.hostname), str(request.message.delivery_tag)
    )


def _delivery_redis() -> Any:
    from shared.redis_client import redis_client

    return redis_client(get_settings().redis_socket_timeout_s)
