"""Fair shares of an API process between tenants and clients, by cost rather than by rate.

- **Searches**: a tenant has at most ``search_tenant_concurrency`` searches running at once
  in one API process (by default half the machine's cores, at least one). A search beyond
  that waits up to ``search_admission_wait_s`` for one of its tenant's own slots, then is
  answered 429 with ``Retry-After``. A search's cost varies a hundredfold (a rerank, a large
  k), so a rate limit alone lets a tenant within its rate take every core; a bound on what it
  runs at once leaves the rest to the others, whatever its searches cost.
- **Failed authentication**: each client *network* (an IPv4 address; an IPv6 /64, which one
  subscriber holds whole; behind ``trusted_proxies``, the forwarded address) has a bucket of
  ``auth_failures_per_second`` failures (burst ``auth_failures_burst``), kept in Redis so
  that every API process spends the same one. A request whose key is not known from a recent
  success *reserves* a failure before its key is looked at, in one atomic step (a Lua script:
  concurrent requests cannot all see the last token), and a key that turns out valid hands
  it back. So however the wrong keys are spread over connections, processes and the
  addresses of one /64, at most the burst plus the refill of the time they take are looked
  up. An empty bucket answers 429 a second late (a flood that sends again as soon as it is
  answered slows to one request a second per connection). A key that is not of Concord's
  format fails without a database lookup. If Redis does not answer, each process keeps the
  buckets in its own memory meanwhile (a limiter outage is no authentication outage).

Search slots live in the process's memory (the event loop's): a search's admission costs no
round trip.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from prometheus_client import Counter

from shared.errors import TooManyRequests
from shared.redis_client import async_redis_client
from shared.settings import Settings

log = logging.getLogger(__name__)

REFUSED = Counter(
    "concord_admission_refused_total",
    "Requests answered 429 before any work: search_slots (a tenant's concurrent searches "
    "stayed full), auth_failures (a client address failed authentication too often), "
    "rate_limit (a key's or tenant's token bucket)",
    ["reason"],
)
CLIENTS_TRACKED = 10_000  # failure buckets kept, the least recently failed dropped first
TARPIT_MAX = 512  # refused requests held back at once (each a sleeping coroutine)


def search_slots(settings: Settings) -> int:
    configured = settings.search_tenant_concurrency
    return configured if configured > 0 else max(1, (os.cpu_count() or 2) // 2)


class _TenantSlots:
    __slots__ = ("free", "waiters")

    def __init__(self, free: int) -> None:
        self.free = free
        self.waiters: list[asyncio.Future[None]] = []


class SearchAdmission:
    """Per-tenant slots for running searches, on one event loop (the API process's)."""

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantSlots] = {}

    @asynccontextmanager
    async def slot(self, tenant_id: str, settings: Settings) -> AsyncIterator[None]:
        """Hold one of ``tenant_id``'s slots for the body, or raise TooManyRequests after
        waiting ``search_admission_wait_s`` for one."""
        size = search_slots(settings)
        slots = self._tenants.setdefault(tenant_id, _TenantSlots(size))
        if slots.free > 0:
            slots.free -= 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            slots.waiters.append(waiter)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), settings.search_admission_wait_s)
            except BaseException as e:  # out of time, or the request was cancelled
                if waiter.done() and isinstance(e, TimeoutError):
                    pass  # handed a slot just as the wait ran out: it is ours
                else:
                    self._leave(tenant_id, slots, size, waiter)
                    if not isinstance(e, TimeoutError):
                        raise
                    REFUSED.labels("search_slots").inc()
                    wait = max(1, math.ceil(settings.search_admission_wait_s))
                    raise TooManyRequests(
                        f"this tenant already runs {size} searches at once in this API "
                        f"process (CONCORD_SEARCH_TENANT_CONCURRENCY); retry in {wait} s",
                        retry_after=wait,
                    ) from None
        try:
            yield
        finally:
            self._release(tenant_id, slots, size)

    def _leave(
        self, tenant_id: str, slots: _TenantSlots, size: int, waiter: asyncio.Future[None]
    ) -> None:
        """A waiter gives up: out of the line, or, had it been handed a slot meanwhile, the
        slot passed on."""
        if waiter.done():
            self._release(tenant_id, slots, size)
        else:
            waiter.cancel()
            slots.waiters.remove(waiter)
            self._forget_if_idle(tenant_id, slots, size)

    def _release(self, tenant_id: str, slots: _TenantSlots, size: int) -> None:
        while slots.waiters:
            waiter = slots.waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next in line
                return
        slots.free += 1
        self._forget_if_idle(tenant_id, slots, size)

    def _forget_if_idle(self, tenant_id: str, slots: _TenantSlots, size: int) -> None:
        # a tenant that searches no more costs no memory
        if slots.free >= size and not slots.waiters:
            self._tenants.pop(tenant_id, None)

    def running(self, tenant_id: str, settings: Settings) -> int:
        slots = self._tenants.get(tenant_id)
        return 0 if slots is None else search_slots(settings) - slots.free


def client_network(peer: str, forwarded_for: str | None, settings: Settings) -> str:
    """The network a request's failures are counted against: the peer's address, or (when
    the peer is one of ``trusted_proxies``) the nearest forwarded address that is not; an
    IPv6 address's /64, an IPv4-mapped one's IPv4 address."""
    trusted = settings.trusted_proxy_networks()
    address = _address(peer)
    if address is not None and trusted and forwarded_for and _within(address, trusted):
        for hop in reversed(forwarded_for.split(",")):
            candidate = _address(hop.strip())
            if candidate is None:
                break  # a hop no proxy of ours wrote: trust nothing past it
            address = candidate
            if not _within(candidate, trusted):
                break
    if address is None:
        return peer[:64] or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _within(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
) -> bool:
    return any(address in network for network in networks)


# KEYS: the network's bucket; ARGV: rate, burst, now (s). Refill, then take one failure if one
# is there: {1, 0}, else {0, seconds until one is}.
_RESERVE = """
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local held, at = tonumber(state[1]) or burst, tonumber(state[2]) or now
local tokens = math.min(burst, held + math.max(0, now - at) * rate)
local allowed, wait = 0, (1 - tokens) / rate
if tokens >= 1 then allowed, wait, tokens = 1, 0, tokens - 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {allowed, tostring(wait)}
"""
# KEYS: the network's bucket; ARGV: burst. A reserved failure handed back (the key was valid).
_REFUND = """
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
if tokens then
  redis.call('HSET', KEYS[1], 'tokens', tostring(math.min(tonumber(ARGV[1]), tokens + 1)))
end
return 1
"""
_BUCKET_PREFIX = "concord:auth-failures:"


class FailedAuthLimiter:
    """A token bucket of authentication failures per client network, shared by every API
    process through Redis (each process's own memory while Redis does not answer)."""

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._tarpitted = 0

    async def reserve(self, network: str, settings: Settings) -> None:
        """Take one of ``network``'s failures before its key is looked at, or raise
        TooManyRequests when none is left, after holding the answer up to a second (a
        tarpit: a client that sends again as soon as it is answered then sends one request
        a second; at most ``TARPIT_MAX`` requests wait so at once, the rest are answered at
        once). :meth:`refund` hands it back when the key is valid."""
        rate = settings.auth_failures_per_second
        if rate <= 0:
            return
        burst = max(1, settings.auth_failures_burst)
        try:
            allowed, wait = await async_redis_client(0.5).eval(
                _RESERVE, 1, _BUCKET_PREFIX + network, rate, burst, time.time()
            )
            refused_for = None if int(allowed) else float(wait)
        except redis.RedisError as e:
            log.warning("failed-authentication buckets kept in memory (Redis: %s)", e)
            refused_for = self._reserve_locally(network, rate, burst)
        if refused_for is not None:
            await self._refuse(rate, refused_for)

    async def refund(self, network: str, settings: Settings) -> None:
        """Hand back the failure :meth:`reserve` took: the key was valid."""
        if settings.auth_failures_per_second <= 0:
            return
        burst = max(1, settings.auth_failures_burst)
        try:
            await async_redis_client(0.5).eval(_REFUND, 1, _BUCKET_PREFIX + network, burst)
        except redis.RedisError:
            held, at = self._buckets.get(network, (float(burst), time.time()))
            self._buckets[network] = (min(float(burst), held + 1), at)

    async def _refuse(self, rate: float, wait: float) -> None:
        REFUSED.labels("auth_failures").inc()
        retry_after = max(1, math.ceil(wait))
        if self._tarpitted < TARPIT_MAX:
            self._tarpitted += 1
            try:
                await asyncio.sleep(min(1.0, retry_after))
            finally:
                self._tarpitted -= 1
        raise TooManyRequests(
            f"too many failed authentications from this network ({rate:g}/s, "
            f"CONCORD_AUTH_FAILURES_PER_SECOND); retry in {retry_after} s",
            retry_after=retry_after,
        )

    def _reserve_locally(self, network: str, rate: float, burst: int) -> float | None:
        """The same bucket in this process's memory: None when a failure was taken, else the
        seconds until one is back."""
        now = time.time()
        held, at = self._buckets.get(network, (float(burst), now))
        tokens = min(float(burst), held + max(0.0, now - at) * rate)
        taken = tokens >= 1
        self._buckets[network] = (tokens - 1 if taken else tokens, now)
        self._buckets.move_to_end(network)
        while len(self._buckets) > CLIENTS_TRACKED:
            self._buckets.popitem(last=False)
        return None if taken else (1 - tokens) / rate


search_admission = SearchAdmission()
failed_auth = FailedAuthLimiter()
