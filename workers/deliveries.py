"""Messages a dead worker was holding go back to their queue in seconds, not after the
broker's visibility timeout.

Tasks acknowledge late: a message stays in kombu's ``unacked`` hash in Redis from its
delivery until its task ends. When a pool child dies its worker's main process hands the
message back at once (``task_reject_on_worker_lost``). When the main process itself dies
(SIGKILL, the OOM killer, a lost host), nothing is left to hand anything back, and kombu
restores the message only once ``broker_visibility_timeout_s`` (an hour: longer than any
task may run) has passed. Ingest jobs do not wait for that (their leases in Postgres are
swept), but upload events live only in their message, so they would.

So each start of a worker (its name, its main process' pid and a random part: a worker
restarted under the same name is another holder) says what it holds:

- it registers in ``concord:workers`` and records each message it receives in its own hash
  ``concord:holding:<id>`` (the message's delivery tag and when), and
- keeps ``concord:worker-alive:<id>`` alive, refreshed every ``ALIVE_REFRESH_S`` with a
  lifetime of ``ALIVE_TTL_S``, from a thread of its own.

The sweep (every ``CONCORD_SWEEP_INTERVAL_SECONDS``) then forgets what was acknowledged,
hands back with kombu's own restore every unacknowledged message whose holder's key has
expired (and any received by a consumer that died before it could record it: unrecorded for
``UNRECORDED_GRACE_S``), and forgets the dead holder.

A holder stalled for ``ALIVE_TTL_S`` (SIGSTOP, a Redis outage longer than that) is taken for
dead: its message may then run twice, which every task tolerates (ingest claims and relay rows
are leased, events already accepted come back ``unchanged``). kombu keeps a message's delivery
tag when it restores it, so the stalled holder's late acknowledgement also clears the new
holder's entry; should that one die too, its message is then lost to this mechanism, as it
is to kombu's own restore.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Any

from celery import Celery
from kombu.transport.redis import Mutex, MutexHeld
from redis import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

WORKERS = "concord:workers"
HOLDING = "concord:holding:"
ALIVE = "concord:worker-alive:"
ALIVE_REFRESH_S = 5.0
ALIVE_TTL_S = 20  # four refreshes, as a job lease is four heartbeats
UNRECORDED_GRACE_S = 60.0


def worker_id(name: str) -> str:
    """This start of worker ``name``: called in its main process."""
    return f"{name}/{os.getpid()}/{secrets.token_hex(4)}"


def record_delivery(client: Redis, holder: str, delivery_tag: str) -> None:
    """``holder`` received the message ``delivery_tag`` (best effort: a message left
    unrecorded is handed back only after ``UNRECORDED_GRACE_S``)."""
    try:
        # registered and alive from its first message on, before its refresh thread starts
        pipe = client.pipeline()
        pipe.hset(HOLDING + holder, delivery_tag, time.time())
        pipe.sadd(WORKERS, holder)
        pipe.set(ALIVE + holder, "1", ex=ALIVE_TTL_S)
        pipe.execute()
    except RedisError as e:
        log.warning("delivery %s not recorded: %s", delivery_tag, e)


def keep_alive(client: Redis, holder: str, stop: threading.Event) -> threading.Thread:
    """Register ``holder`` and refresh its alive key from a daemon thread until ``stop`` is
    set (or the process dies: then the key expires within ``ALIVE_TTL_S``)."""

    def refresh() -> None:
        while True:
            try:
                pipe = client.pipeline()
                pipe.sadd(WORKERS, holder)
                pipe.set(ALIVE + holder, "1", ex=ALIVE_TTL_S)
                pipe.execute()
            except RedisError as e:  # the next refresh tries again
                log.warning("worker %s: alive key not refreshed: %s", holder, e)
            if stop.wait(ALIVE_REFRESH_S):
                return

    thread = threading.Thread(target=refresh, name="concord-worker-alive", daemon=True)
    thread.start()
    return thread


def restore_orphaned(app: Celery, client: Redis) -> list[str]:
    """Hand back to their queues the unacknowledged messages whose holder is dead, and
    forget what was acknowledged; returns the delivery tags handed back. One sweep at a time,
    and never beside kombu's own restore (both under kombu's unacked mutex)."""
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        try:
            with Mutex(client, channel.unacked_mutex_key, channel.unacked_mutex_expire):
                orphaned = _orphaned(client, channel)
                for tag in orphaned:
                    # kombu's restore: in a transaction that watches the unacked hash, so a
                    # message acknowledged meanwhile is not pushed again
                    channel.qos.restore_by_tag(tag)
        except MutexHeld:
            return []  # another sweep (or kombu's restore) is at it; the next sweep looks again
    if orphaned:
        log.warning("handed back %d messages held by dead workers: %s", len(orphaned), orphaned)
    return orphaned


def _orphaned(client: Redis, channel: Any) -> list[str]:
    # The holders first, then the unacked set: kombu adds a message to that set before its
    # holder records it, so a recorded tag missing from the later read was acknowledged.
    holders = sorted(h.decode() for h in client.smembers(WORKERS))  # type: ignore[union-attr]
    pipe = client.pipeline()
    for holder in holders:
        pipe.exists(ALIVE + holder)
        pipe.hgetall(HOLDING + holder)
    answers = pipe.execute()
    now = time.time()
    unacked = _scores(client.zrange(channel.unacked_index_key, 0, -1, withscores=True))
    held = {
        holder: ({t.decode(): float(at) for t, at in tags.items()}, bool(alive))
        for holder, alive, tags in zip(holders, answers[::2], answers[1::2], strict=True)
    }
    live = {tag for tags, alive in held.values() if alive for tag in tags}
    recorded = {tag for tags, _ in held.values() for tag in tags}
    orphaned: set[str] = set()
    for holder, (tags, alive) in held.items():
        if alive:
            acknowledged = tags.keys() - unacked.keys()
            if acknowledged:
                client.hdel(HOLDING + holder, *acknowledged)
            continue
        orphaned |= {
            tag
            for tag, received_at in tags.items()
            # still unacknowledged, not since taken by a live worker (a message handed back
            # keeps its tag; its new delivery is later than this holder's record)
            if tag in unacked and tag not in live and unacked[tag] <= received_at + 1.0
        }
        pipe = client.pipeline()
        pipe.delete(HOLDING + holder)
        pipe.srem(WORKERS, holder)
        pipe.execute()
    orphaned |= {
        tag
        for tag, delivered_at in unacked.items()
        if tag not in recorded and now - delivered_at >= UNRECORDED_GRACE_S
    }
    return sorted(orphaned)


def _scores(rows: Any) -> dict[str, float]:
    return {tag.decode(): float(score) for tag, score in rows}
