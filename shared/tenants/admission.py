"""Fair shares of an API process between tenants and clients, by cost rather than by rate.

- **Searches**: a tenant has at most ``search_tenant_concurrency`` searches running at once
  in one API process (by default half the machine's cores, at least one). A search beyond
  that waits up to ``search_admission_wait_s`` for one of its tenant's own slots, then is
  answered 429 with ``Retry-After``. A search's cost varies a hundredfold (a rerank, a large
  k), so a rate limit alone lets a tenant within its rate take every core; a bound on what it
  runs at once leaves the rest to the others, whatever its searches cost.
- **Failed authentication**: each client address has a bucket of ``auth_failures_per_second``
  failures (burst ``auth_failures_burst``); an empty one answers 429 before the key is even
  hashed, a second late (a flood that sends again as soon as it is answered slows to one
  request a second per connection). A key that is not of Concord's format fails without a
  database lookup.

Both live in the process's memory (the event loop's), so neither costs a round trip: a flood
is turned away for less than it would cost to look at it.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import Counter

from shared.errors import TooManyRequests
from shared.settings import Settings

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


class FailedAuthLimiter:
    """A token bucket of authentication failures per client address."""

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._tarpitted = 0

    async def check(self, client: str, settings: Settings) -> None:
        """Raise TooManyRequests while ``client`` has no failure left to spend, after holding
        the answer up to a second (a tarpit: a client that sends again as soon as it is
        answered then sends one request a second, not as many as the API can refuse; at most
        ``TARPIT_MAX`` requests wait so at once, the rest are answered at once)."""
        rate = settings.auth_failures_per_second
        if rate <= 0:
            return
        tokens = self._tokens(client, settings)
        if tokens < 1:
            REFUSED.labels("auth_failures").inc()
            retry_after = max(1, math.ceil((1 - tokens) / rate))
            if self._tarpitted < TARPIT_MAX:
                self._tarpitted += 1
                try:
                    await asyncio.sleep(min(1.0, retry_after))
                finally:
                    self._tarpitted -= 1
            raise TooManyRequests(
                f"too many failed authentications from this address "
                f"({rate:g}/s, CONCORD_AUTH_FAILURES_PER_SECOND); retry in {retry_after} s",
                retry_after=retry_after,
            )

    def failed(self, client: str, settings: Settings) -> None:
        if settings.auth_failures_per_second <= 0:
            return
        self._buckets[client] = (self._tokens(client, settings) - 1, time.monotonic())
        self._buckets.move_to_end(client)
        while len(self._buckets) > CLIENTS_TRACKED:
            self._buckets.popitem(last=False)

    def _tokens(self, client: str, settings: Settings) -> float:
        burst = float(max(1, settings.auth_failures_burst))
        held, at = self._buckets.get(client, (burst, time.monotonic()))
        return min(burst, held + (time.monotonic() - at) * settings.auth_failures_per_second)


search_admission = SearchAdmission()
failed_auth = FailedAuthLimiter()
