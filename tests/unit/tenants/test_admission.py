"""Fair shares of an API process: a tenant's concurrent searches are bounded (the excess waits
for its own tenant's slots, then 429), and a client address that keeps failing
authentication is turned away before any key lookup."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.errors import TooManyRequests
from shared.settings import Settings
from shared.tenants.admission import FailedAuthLimiter, SearchAdmission, client_network

ONE_SLOT = Settings(search_tenant_concurrency=1, search_admission_wait_s=0.3)


def test_a_tenants_flood_waits_for_its_own_slots_and_never_delays_another_tenant() -> None:
    async def scenario() -> dict[str, Any]:
        admission = SearchAdmission()
        order: list[str] = []
        release = asyncio.Event()

        async def search(tenant: str, name: str, hold: bool) -> str:
            try:
                async with admission.slot(tenant, ONE_SLOT):
                    order.append(f"{name} runs")
                    if hold:
                        await release.wait()
                    return "ok"
            except TooManyRequests as e:
                return f"429 after {e.headers['Retry-After']}"

        first = asyncio.create_task(search("flooder", "f1", hold=True))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(search("flooder", "f2", hold=False))
        refused = asyncio.create_task(search("flooder", "f3", hold=True))
        await asyncio.sleep(0.05)
        victim = await asyncio.wait_for(search("victim", "v1", hold=False), 0.1)  # no wait
        assert admission.running("flooder", ONE_SLOT) == 1
        await asyncio.sleep(0.1)
        release.set()  # f1 ends: its slot goes to f2, the oldest waiter
        results = await asyncio.gather(first, waiting, refused)
        return {"order": order, "victim": victim, "results": results, "left": admission}

    outcome = asyncio.run(scenario())
    assert outcome["victim"] == "ok"
    assert outcome["order"][:2] == ["f1 runs", "v1 runs"]
    assert outcome["order"][2] == "f2 runs"
    first, waiting, refused = outcome["results"]
    assert first == "ok" and waiting == "ok"
    assert refused in ("ok", "429 after 1")  # third in line: served or refused with a wait
    assert outcome["left"].running("flooder", ONE_SLOT) == 0  # every slot came back


def test_a_waiter_that_gives_up_or_is_cancelled_leaks_no_slot() -> None:
    async def scenario() -> int:
        admission = SearchAdmission()
        release = asyncio.Event()

        async def hold() -> None:
            async with admission.slot("t", ONE_SLOT):
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        with pytest.raises(TooManyRequests):
            async with admission.slot("t", ONE_SLOT):
                pass
        cancelled = asyncio.create_task(hold())
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        release.set()
        await holder
        async with admission.slot("t", ONE_SLOT):  # free again, at once
            return admission.running("t", ONE_SLOT)

    assert asyncio.run(scenario()) == 1


def test_failures_are_counted_per_network_and_behind_trusted_proxies_per_client() -> None:
    """An IPv6 client rotating through its /64 is one network; an IPv4-mapped address is its
    IPv4 address; X-Forwarded-For counts only from a trusted proxy, and only up to the
    nearest hop that is not one."""
    plain = Settings()
    assert client_network("2001:db8:1:2::1", None, plain) == "2001:db8:1:2::/64"
    assert client_network("2001:db8:1:2:ffff::9", None, plain) == "2001:db8:1:2::/64"
    assert client_network("::ffff:203.0.113.9", None, plain) == "203.0.113.9"
    assert client_network("203.0.113.9", "198.51.100.7", plain) == "203.0.113.9"
    proxied = Settings(trusted_proxies="10.0.0.0/8")
    assert client_network("10.1.2.3", "198.51.100.7", proxied) == "198.51.100.7"
    # a client cannot pick its address by writing one: the hop our proxy saw is taken
    assert client_network("10.1.2.3", "1.2.3.4, 198.51.100.7, 10.9.9.9", proxied) == (
        "198.51.100.7"
    )
    assert client_network("203.0.113.9", "198.51.100.7", proxied) == "203.0.113.9"


def test_without_redis_each_process_keeps_the_buckets_in_memory() -> None:
    limiter = FailedAuthLimiter()
    taken = [limiter._reserve_locally("203.0.113.9", 1.0, 3) for _ in range(4)]
    assert taken[:3] == [None, None, None] and taken[3] is not None and taken[3] > 0
    assert limiter._reserve_locally("198.51.100.1", 1.0, 3) is None  # another network
