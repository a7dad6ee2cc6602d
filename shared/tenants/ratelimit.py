"""Per-key rate limits: a token bucket per API key, kept in Redis so every API process shares it.

Each key refills ``rate_limit_per_second`` tokens a second up to ``rate_limit_burst``; a request
takes one. An empty bucket answers 429 with ``Retry-After`` (whole seconds until a token is
back). Buckets are per key, so one tenant's burst never takes another's tokens. If Redis cannot
be reached the request is let through (logged): an outage of the limiter must not become an
outage of search."""

from __future__ import annotations

import logging
import math
import time
import uuid

import redis

from shared.errors import TooManyRequests
from shared.redis_client import async_redis_client
from shared.settings import get_settings

log = logging.getLogger(__name__)

# KEYS[1] bucket; ARGV: rate per second, burst, now (s). Returns {allowed, seconds to wait}.
_TOKEN_BUCKET = """
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed, wait = 0, (1 - tokens) / rate
if tokens >= 1 then
  tokens, allowed, wait = tokens - 1, 1, 0
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring(wait)}
"""


async def enforce(key_id: uuid.UUID) -> None:
    """Take one token of the key's bucket, or raise TooManyRequests. A coroutine: the API
    calls it on its event loop, so a request's limit costs one Redis round trip and no
    thread."""
    settings = get_settings()
    if settings.rate_limit_per_second <= 0:
        return
    # Half a second at most per request; the limiter fails open at once after that.
    client = async_redis_client(0.5)
    try:
        allowed, wait = await client.eval(
            _TOKEN_BUCKET,
            1,
            f"concord:ratelimit:{key_id}",
            settings.rate_limit_per_second,
            settings.rate_limit_burst,
            time.time(),
        )
    except redis.RedisError as e:
        log.warning("rate limiter unavailable, request let through: %s", type(e).__name__)
        return
    if not int(allowed):
        retry_after = max(1, math.ceil(float(wait)))
        raise TooManyRequests(
            f"rate limit of {settings.rate_limit_per_second:g} requests/s for this API key "
            f"exceeded; retry in {retry_after} s",
            retry_after=retry_after,
        )
