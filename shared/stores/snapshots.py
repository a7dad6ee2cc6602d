"""Short-lived snapshots in Redis (a paginated search's ranking, shared/search/cursors.py):
each under an id for ``search_cursor_ttl_s``, a tenant keeping at most
``search_cursors_per_tenant`` live ones, its oldest dropped first, so that one tenant's paging
cannot evict another's. Redis is also the broker: what it holds here stays bounded."""

from __future__ import annotations

import functools

import redis
from redis.commands.core import Script
from redis.exceptions import ResponseError

from shared.redis_client import redis_client
from shared.settings import Settings
from shared.stores.driver_errors import raises_redis_errors, refused_for_now

PREFIX = "concord:search-cursor:"

# Store the snapshot, forget the tenant's expired snapshots and drop its oldest past the cap,
# in one step (a script: two saves at once cannot both count the same excess and drop twice
# as many). KEYS: the snapshot's key, the tenant's set; ARGV: the snapshot, the TTL, the cap,
# the snapshot's id, the snapshots' key prefix.
_SAVE_SCRIPT = """
local time = redis.call('TIME')  -- to the microsecond: the oldest goes first, not the least id
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[2])
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #oldest, 2 do redis.call('DEL', ARGV[5] .. oldest[i]) end
end
"""


@raises_redis_errors  # Concord's store errors, never redis-py's
class RedisSnapshots:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def put(self, tenant_id: str, snapshot_id: str, blob: bytes) -> None:
        """Keep ``blob`` under ``snapshot_id`` (an id the caller drew at random)."""
        settings = self.settings
        _save_script(self._redis())(
            keys=[PREFIX + snapshot_id, _live_snapshots(tenant_id)],
            args=[
                blob,
                settings.search_cursor_ttl_s,
                max(1, settings.search_cursors_per_tenant),
                snapshot_id,
                PREFIX,
            ],
        )

    def get(self, snapshot_id: str) -> bytes | None:
        """The snapshot, or None once it expired or was dropped (or was never kept)."""
        try:
            raw = self._redis().get(PREFIX + snapshot_id)
        except ResponseError as e:
            if refused_for_now(e):
                raise
            return None  # not a snapshot's key (only a forged id could name one)
        return raw if isinstance(raw, bytes) else None

    def _redis(self) -> redis.Redis:
        return redis_client(self.settings.redis_socket_timeout_s)


@functools.cache
def _save_script(client: redis.Redis) -> Script:
    """The save script, bound to the process's client (registered once: its SHA-1 is sent
    after the first call, the script itself only when Redis does not know it)."""
    return client.register_script(_SAVE_SCRIPT)


def _live_snapshots(tenant_id: str) -> str:
    """The tenant's snapshots, each scored by when it expires (Redis' clock)."""
    return f"{PREFIX}tenant:{tenant_id}"
