"""Fair shares of an API process: a tenant's concurrent searches are bounded (the excess waits
for its own tenant's slots, then 429), and a client address that keeps failing
authentication is turned away before any key lookup."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import random
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from shared.errors import TooManyRequests
from shared.settings import Settings


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
    from shared.tenants import admission
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
    # The bucket's clock stands still unless the test moves it: a slow machine refills nothing.
    now = [1000.0]
    monkeypatch.setattr(admission, "time", SimpleNamespace(time=lambda: now[0]))
    flooder = TestClient(client.app, client=(f"203.0.113.{random.randint(1, 254)}", 40000))
    victim = TestClient(client.app, client=("198.51.100.20", 40001))
    burst = get_settings().auth_failures_burst
    rate = get_settings().auth_failures_per_second

    def flood(count: int) -> list[int]:
        codes = []
        for i in range(count):
            wrong = "ck_" + f"{len(lookups) + i:043d}"
            answer = flooder.get("/v1/documents", headers={"Authorization": f"Bearer {wrong}"})
            if answer.status_code == 429:
                assert int(answer.headers["Retry-After"]) >= 1
            codes.append(answer.status_code)
            assert victim.get("/v1/documents", headers=auth).status_code == 200
        return codes

    malformed = flooder.get("/v1/documents", headers={"Authorization": "Bearer not-a-key"})
    assert malformed.status_code == 401 and lookups == []

    before = _refused("auth_failures")
    # the malformed key spent a failure too: burst - 1 more are looked up, then refused
    assert flood(burst + 2) == [401] * (burst - 1) + [429] * 3
    assert len(lookups) == burst - 1
    assert _refused("auth_failures") - before == 3
    now[0] += 1.0  # a second later the bucket holds `rate` failures again, and no more
    assert flood(int(rate) + 1) == [401] * int(rate) + [429]
    assert len(lookups) == burst - 1 + int(rate)


def test_concurrent_wrong_keys_over_two_processes_and_one_ipv6_network_share_one_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the limiter keyed on the exact address (a client rotating through its /64
    was never limited) and lived in each API process (N processes allowed N times the
    budget), and its check and its record were two steps around the lookup (concurrent
    wrong keys all passed a nearly empty bucket). 200 reservations at once, from 200
    addresses of one /64, through the limiters of two processes (each its own instance, as
    in another process): exactly the burst get through, the rest are refused."""
    from shared.settings import get_settings
    from shared.tenants import admission

    settings = get_settings().model_copy(
        update={"auth_failures_per_second": 2.0, "auth_failures_burst": 20}
    )
    monkeypatch.setattr(admission, "time", SimpleNamespace(time=lambda: 5000.0))
    monkeypatch.setattr(admission, "TARPIT_MAX", 0)  # refused at once: the test needs no wait
    network = ipaddress.IPv6Network(f"2001:db8:{random.randint(1, 0xFFFF):x}::/64")
    processes = [admission.FailedAuthLimiter(), admission.FailedAuthLimiter()]

    async def flood() -> list[bool]:
        async def one(i: int) -> bool:
            address = str(network[random.randint(1, 2**63)])
            try:
                await processes[i % 2].reserve(
                    admission.client_network(address, None, settings), settings
                )
                return True
            except TooManyRequests:
                return False

        return await asyncio.gather(*(one(i) for i in range(200)))

    passed = asyncio.run(flood())
    assert sum(passed) == settings.auth_failures_burst
    assert all(not p._buckets for p in processes)  # kept in Redis, not in either process
    # another network's bucket is its own
    other = f"198.51.100.{random.randint(1, 254)}-{uuid.uuid4().hex[:4]}"
    asyncio.run(processes[0].reserve(other, settings))
