"""The one way this project opens a Redis client (the broker's connections are Celery's)."""

from __future__ import annotations

import asyncio
import weakref
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.settings import Settings, get_settings


@lru_cache
def redis_client(timeout_s: float) -> redis.Redis:
    """A client of the configured Redis that waits at most ``timeout_s`` to connect or for an
    answer, and tries once: redis-py retries 3 times with backoff by default, which made a
    silent Redis cost 9 s per call. Callers decide what to do when it fails (the rate limiter
    fails open, the sweep waits for its next run). One client per timeout per process."""
    return new_redis_client(get_settings(), timeout_s)


def new_redis_client(settings: Settings, timeout_s: float) -> redis.Redis:
    """A client of ``settings``' Redis, as :func:`redis_client` makes them (one try, bounded
    waits), for a caller that keeps its own (an adapter bound to other settings)."""
    return redis.Redis(**redis_options(settings, timeout_s), retry=Retry(NoBackoff(), 0))


def redis_options(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Where ``settings``' Redis is, and how long to wait for it."""
    return {
        "host": settings.redis_host,
        "port": settings.redis_port,
        "db": settings.redis_db,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }


# One asyncio client per event loop: its connections belong to the loop that opened them (the
# API has one loop; each of the tests' clients runs its own).
_async_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[float, redis.asyncio.Redis]
] = weakref.WeakKeyDictionary()


def async_redis_client(timeout_s: float) -> redis.asyncio.Redis:
    """:func:`redis_client` for coroutines on the running event loop (the API answers a
    request's rate limit without leaving its loop for a thread). Its connections are a
    blocking pool of ``ASYNC_CONNECTIONS``: a burst of requests (200 wrong keys at once) waits
    up to ``timeout_s`` for a connection instead of failing with "Too many connections"
    past the default pool's 100, which made the limiters fail open."""
    clients = _async_clients.setdefault(asyncio.get_running_loop(), {})
    if timeout_s not in clients:
        pool = redis.asyncio.BlockingConnectionPool(
            max_connections=ASYNC_CONNECTIONS,
            timeout=timeout_s,
            retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
            **redis_options(get_settings(), timeout_s),
        )
        clients[timeout_s] = redis.asyncio.Redis(connection_pool=pool)
    return clients[timeout_s]


ASYNC_CONNECTIONS = 32
