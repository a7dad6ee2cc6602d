"""Fair shares of an API process: a tenant's concurrent searches are bounded (the excess waits
for its own tenant's slots, then 429), and a client address that keeps failing
authentication is turned away before any key lookup."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

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


def _refused(reason: str) -> float:
    return REGISTRY.get_sample_value("concord_admission_refused_total", {"reason": reason}) or 0.0


def test_a_wrong_key_flood_is_refused_before_any_lookup_and_others_are_served(
    client: TestClient, api_key: str, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From one address: malformed keys never reach Postgres; well-formed wrong ones are
    looked up until the address's failure bucket is empty, then answered 429 (counted in
    the metrics) without a lookup. A client at another address, with a valid key, is served
    throughout."""
    from shared.settings import get_settings
    from shared.tenants import repository as tenants_repo

    lookups: list[str] = []
    original = tenants_repo.key_by_hash

    victims_key = hashlib.sha256(api_key.encode()).hexdigest()

    def counting(session: Any, digest: str) -> Any:
        if digest != victims_key:
            lookups.append(digest)
        return original(session, digest)

    monkeypatch.setattr(tenants_repo, "key_by_hash", counting)
    # the shipped bucket (the suite's settings open it wide: its clients share an address)
    shipped = Settings.model_fields
    for name in ("auth_failures_per_second", "auth_failures_burst"):
        monkeypatch.setattr(get_settings(), name, shipped[name].default)
    flooder = TestClient(client.app, client=("203.0.113.77", 40000))
    victim = TestClient(client.app, client=("198.51.100.20", 40001))
    burst = get_settings().auth_failures_burst

    malformed = flooder.get("/v1/documents", headers={"Authorization": "Bearer not-a-key"})
    assert malformed.status_code == 401 and lookups == []

    before = _refused("auth_failures")
    answers = []
    started = time.monotonic()
    for i in range(burst + 6):
        wrong = "ck_" + f"{i:043d}"
        answers.append(flooder.get("/v1/documents", headers={"Authorization": f"Bearer {wrong}"}))
        assert victim.get("/v1/documents", headers=auth).status_code == 200
    elapsed = time.monotonic() - started
    codes = [a.status_code for a in answers]
    assert codes[: burst - 1] == [401] * (burst - 1)  # the malformed one spent a failure too
    assert codes[burst - 1] == 429  # the bucket is empty: refused, held back a second
    assert set(codes[burst:]) <= {401, 429}  # then looked up again only at the refill rate
    assert all(a.headers["Retry-After"] for a in answers if a.status_code == 429)
    rate = get_settings().auth_failures_per_second
    assert len(lookups) <= burst - 1 + rate * elapsed + 1
    assert codes.count(429) >= 3
    assert _refused("auth_failures") - before >= 3
