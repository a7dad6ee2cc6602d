"""Fair shares of an API process: a tenant's concurrent searches are bounded (the excess waits
for its own tenant's slots, then 429), and a client address that keeps failing
authentication is turned away before any key lookup."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

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
    monkeypatch.setattr(admission, "time", SimpleNamespace(monotonic=lambda: now[0]))
    flooder = TestClient(client.app, client=("203.0.113.77", 40000))
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
