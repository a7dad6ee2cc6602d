"""Rate limits: a token bucket per API key and one per tenant, kept in Redis so every API
process shares them.

Each key refills ``rate_limit_per_second`` tokens a second up to ``rate_limit_burst``, and its
tenant ``rate_limit_tenant_per_second`` up to ``rate_limit_tenant_burst`` for all its keys
together (a tenant admin may create any number of keys: they share the tenant's bucket); a
request takes one token of each. An empty bucket answers 429 with ``Retry-After`` (whole
seconds until a token of each is back). One tenant's burst never takes another's tokens. If
Redis cannot be reached the request is let through (logged): an outage of the limiter must
not become an outage of search."""

from __future__ import annotations

import logging
import math
import time
import uuid

import redis

from shared.errors import TooManyRequests
from shared.redis_client import async_redis_client
from shared.settings import get_settings
from shared.tenants.admission import REFUSED

log = logging.getLogger(__name__)

UNLIMITED = 1e9  # tokens a second: what a bucket that is turned off refills

# KEYS: the key's bucket, the tenant's; ARGV: the key's rate and burst, the tenant's, now (s).
# Both buckets refill; a token is taken from each only if each has one. Returns {allowed,
# seconds to wait (the longer of the two)}.
_TOKEN_BUCKETS = """
local now = tonumber(ARGV[5])
local tokens, waits = {}, {0, 0}
for i = 1, 2 do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  local held = tonumber(state[1]) or burst
  local at = tonumber(state[2]) or now
  tokens[i] = math.min(burst, held + math.max(0, now - at) * rate)
  if tokens[i] < 1 then waits[i] = (1 - tokens[i]) / rate end
end
local allowed = 0
if tokens[1] >= 1 and tokens[2] >= 1 then
  allowed = 1
  tokens[1], tokens[2] = tokens[1] - 1, tokens[2] - 1
end
for i = 1, 2 do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  redis.call('HSET', KEYS[i], 'tokens', tostring(tokens[i]), 'at', tostring(now))
  redis.call('EXPIRE', KEYS[i], math.ceil(burst / rate) + 1)
end
return {allowed, tostring(math.max(waits[1], waits[2]))}
"""


async def enforce(key_id: uuid.UUID, tenant_id: str) -> None:
    """Take one token of the key's bucket and one of its tenant's, or raise TooManyRequests.
    A coroutine: the API calls it on its event loop, so a request's limit costs one Redis
    round trip and no thread."""
    settings = get_settings()
    per_key, per_tenant = settings.rate_limit_per_second, settings.rate_limit_tenant_per_second
    if per_key <= 0 and per_tenant <= 0:
        return
    # Half a second at most per request; the limiter fails open at once after that.
    client = async_redis_client(0.5)
    try:
        allowed, wait = await client.eval(
            _TOKEN_BUCKETS,
            2,
            f"concord:ratelimit:{key_id}",
            f"concord:ratelimit:tenant:{tenant_id}",
            # 0 or less turns a bucket off: a rate no request can outrun
            per_key if per_key > 0 else UNLIMITED,
            max(1, settings.rate_limit_burst),
            per_tenant if per_tenant > 0 else UNLIMITED,
            max(1, settings.rate_limit_tenant_burst),
            time.time(),
        )
    except redis.RedisError as e:
        log.warning("rate limiter unavailable, request let through: %s", type(e).__name__)
        return
    if not int(allowed):
        REFUSED.labels("rate_limit").inc()
        retry_after = max(1, math.ceil(float(wait)))
        limits = [f"{per_key:g} requests/s per API key"] if per_key > 0 else []
        limits += [f"{per_tenant:g} per tenant"] if per_tenant > 0 else []
        raise TooManyRequests(
            f"rate limit exceeded ({', '.join(limits)}); retry in {retry_after} s",
            retry_after=retry_after,
        )
