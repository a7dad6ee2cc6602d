"""Messages a dead worker was holding go back to their queue in seconds, not after the
broker's visibility timeout.

Tasks acknowledge late: a message stays in kombu's ``unacked`` hash in Redis from its
delivery until its task ends. When a pool child dies its worker's main process hands the
message back at once (``task_reject_on_worker_lost``). When the main process itself dies
(SIGKILL, the OOM killer, a lost host), nothing is left to hand anything back, and kombu
restores the message only once ``broker_visibility_timeout_s`` (an hour: longer than any
task may run) has passed. Ingest jobs do not wait for that (their leases in Postgres are
swept), but upload events live only in their message, so they would.

So each worker says who holds what:

- its main process records the worker's name against each message it receives
  (``concord:delivery:<tag>``, kept as long as kombu keeps the message unacked), and
- keeps ``concord:worker-alive:<name>`` alive, refreshed every ``ALIVE_REFRESH_S`` with a
  lifetime of ``ALIVE_TTL_S``, from a thread of its own.

The sweep (every ``CONCORD_SWEEP_INTERVAL_SECONDS``) then hands back, with kombu's own
restore, every unacknowledged message whose holder's key has expired, and any received by a
consumer that died before it could record it (none recorded for ``UNRECORDED_GRACE_S``).
A holder too busy to refresh its key for ``ALIVE_TTL_S`` is taken for dead: its message may
then run twice, which every task tolerates (ingest claims and relay rows are leased, events
already accepted come back ``unchanged``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery
from redis import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

DELIVERY = "concord:delivery:"
ALIVE = "concord:worker-alive:"
ALIVE_REFRESH_S = 5.0
ALIVE_TTL_S = 20  # four refreshes, as a job lease is four heartbeats
UNRECORDED_GRACE_S = 60.0


def record_delivery(client: Redis, delivery_tag: str, worker: str, keep_s: int) -> None:
    """The main process of ``worker`` holds the message ``delivery_tag`` (best effort: a
    message left unrecorded is handed back only after ``UNRECORDED_GRACE_S``)."""
    try:
        client.set(DELIVERY + delivery_tag, worker, ex=keep_s)
    except RedisError as e:
        log.warning("delivery %s not recorded: %s", delivery_tag, e)


def keep_alive(client: Redis, worker: str, stop: threading.Event) -> threading.Thread:
    """A daemon thread that refreshes the worker's alive key until ``stop`` is set (or the
    process dies: then the key expires within ``ALIVE_TTL_S``)."""

    def refresh() -> None:
        while True:
            try:
                client.set(ALIVE + worker, "1", ex=ALIVE_TTL_S)
            except RedisError as e:  # the next refresh tries again
                log.warning("worker %s: alive key not refreshed: %s", worker, e)
            if stop.wait(ALIVE_REFRESH_S):
                return

    thread = threading.Thread(target=refresh, name="concord-worker-alive", daemon=True)
    thread.start()
    return thread


def restore_orphaned(app: Celery, client: Redis) -> list[str]:
    """Hand back to their queues the unacknowledged messages whose holder is dead; returns
    their delivery tags."""
    restored: list[str] = []
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        now = time.time()
        delivered: list[tuple[bytes, float]] = client.zrange(  # type: ignore[assignment]
            channel.unacked_index_key, 0, now - ALIVE_REFRESH_S, byscore=True, withscores=True
        )
        for raw_tag, delivered_at in delivered:
            tag = raw_tag.decode()
            holder: bytes | None = client.get(DELIVERY + tag)  # type: ignore[assignment]
            if holder is None:
                if now - delivered_at < UNRECORDED_GRACE_S:
                    continue
            elif client.exists(ALIVE + holder.decode()):
                continue
            # kombu's restore: in a transaction that watches the unacked hash, so a message
            # acknowledged meanwhile (or restored by another sweep) is not pushed again
            channel.qos.restore_by_tag(tag)
            client.delete(DELIVERY + tag)
            restored.append(tag)
    if restored:
        log.warning("handed back %d messages held by dead workers: %s", len(restored), restored)
    return restored
