"""Fair shares of an API process: a tenant's concurrent searches are bounded (the excess waits
for its own tenant's slots, then 429), and a client address that keeps failing
authentication is turned away before any key lookup."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shared.errors import TooManyRequests
from shared.settings import Settings
from shared.tenants.admission import FailedAuthLimiter, SearchAdmission

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


def test_failed_authentications_are_limited_per_client_address() -> None:
    limiter = FailedAuthLimiter()
    settings = Settings(auth_failures_per_second=1, auth_failures_burst=3)
    for _ in range(3):
        asyncio.run(limiter.check("203.0.113.9", settings))
        limiter.failed("203.0.113.9", settings)
    started = time.monotonic()
    with pytest.raises(TooManyRequests) as refused:
        asyncio.run(limiter.check("203.0.113.9", settings))
    assert time.monotonic() - started >= 0.9  # held back: a flood slows to its pace
    assert refused.value.headers["Retry-After"] == "1"
    asyncio.run(limiter.check("198.51.100.1", settings))  # another address is not affected
