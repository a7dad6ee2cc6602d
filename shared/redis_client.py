"""The one way this project opens a Redis client (the broker's connections are Celery's)."""

from __future__ import annotations

from functools import lru_cache

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.settings import get_settings


@lru_cache
def redis_client(timeout_s: float) -> redis.Redis:
    """A client of the configured Redis that waits at most ``timeout_s`` to connect or for an
    answer, and tries once: redis-py retries 3 times with backoff by default, which made a
    silent Redis cost 9 s per call. Callers decide what to do when it fails (the rate limiter
    fails open, the sweep waits for its next run). One client per timeout per process."""
    settings = get_settings()
    return redis.Redis(
        host=settings.redis_host,
        port=settings.redis_port,
        db=settings.redis_db,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
