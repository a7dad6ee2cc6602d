"""Authentication on every route, per-key rate limits, and secrets kept out of logs."""

from __future__ import annotations

import logging
import re
import time
import uuid

import pytest
from fastapi.testclient import TestClient

from shared.settings import get_settings
from tests.helpers import key_headers

PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"}


def _concrete(path: str) -> str:
    """A path template with every parameter filled in (ids that exist nowhere)."""
    return re.sub(
        r"\{[^}]+\}", lambda m: "1" if "letter" in m.group(0) else str(uuid.uuid4()), path
    )


def test_every_protected_route_answers_401_without_akey_headers(client: TestClient) -> None:
    from services.api.app import create_app

    # Every route the API documents (health, readiness and metrics are not in the schema).
    routes = [
        (method.upper(), path)
        for path, operations in create_app().openapi()["paths"].items()
        if path not in PUBLIC
        for method in operations
    ]
    assert len(routes) >= 15, routes  # the table really covers the API
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer ck_not-a-real-key"}, {"X-API-Key": "nope"}):
            response = client.request(method, _concrete(path), headers=headers, json={})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"


def test_at_twice_the_rate_limit_the_excess_gets_429_and_other_tenants_do_not(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = get_settings()
    # a token back every 20 s: the ten requests outrun it however slow the machine is
    monkeypatch.setattr(settings, "rate_limit_per_second", 0.05)
    monkeypatch.setattr(settings, "rate_limit_burst", 5)
    noisy = key_headers(f"t-{uuid.uuid4().hex[:10]}", ["read"])
    quiet = key_headers(f"t-{uuid.uuid4().hex[:10]}", ["read"])
    noisy_statuses, quiet_statuses, retry_after = [], [], []
    for i in range(10):  # twice the burst, faster than the refill
        response = client.get("/v1/profiles", headers=noisy)
        noisy_statuses.append(response.status_code)
        if response.status_code == 429:
            retry_after.append(int(response.headers["Retry-After"]))
        if i % 2 == 0:
            quiet_statuses.append(client.get("/v1/profiles", headers=quiet).status_code)
    assert noisy_statuses == [200] * 5 + [429] * 5, noisy_statuses
    assert all(seconds >= 1 for seconds in retry_after)
    assert quiet_statuses == [200] * 5  # the other tenant's bucket is untouched


def test_a_tenants_keys_share_its_bucket_and_other_tenants_are_unaffected(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant admin may create any number of keys: a new key per request must not outrun
    the tenant's own limit."""
    settings = get_settings()
    monkeypatch.setattr(settings, "rate_limit_tenant_per_second", 0.05)
    monkeypatch.setattr(settings, "rate_limit_tenant_burst", 5)
    noisy_tenant = f"t-{uuid.uuid4().hex[:10]}"
    quiet = key_headers(f"t-{uuid.uuid4().hex[:10]}", ["read"])
    keys = [key_headers(noisy_tenant, ["read"]) for _ in range(10)]
    noisy_statuses = [client.get("/v1/profiles", headers=k).status_code for k in keys]
    assert noisy_statuses == [200] * 5 + [429] * 5, noisy_statuses
    assert [client.get("/v1/profiles", headers=quiet).status_code for _ in range(3)] == [200] * 3


def test_a_canary_key_never_reaches_logs_or_error_bodies(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "ck_CANARY" + uuid.uuid4().hex
    valid = key_headers(f"t-{uuid.uuid4().hex[:10]}", ["read", "write"])
    with caplog.at_level(logging.DEBUG):
        bodies = [
            client.post("/v1/search", headers={"Authorization": f"Bearer {canary}"},
                        json={"query": "x"}).text,
            client.get("/v1/profiles", headers={"X-API-Key": canary}).text,
            client.post("/v1/search", headers=valid, json={"query": "canary check"}).text,
        ]  # fmt: skip
    assert all(canary not in body for body in bodies)
    assert canary not in caplog.text
    assert get_settings().pg_password not in caplog.text


def test_a_key_revoked_by_another_process_is_refused_within_the_shipped_cache_time(
    client: TestClient,
) -> None:
    """The API remembers a verified key for CONCORD_AUTH_CACHE_SECONDS (shipped: 5 s). A key
    revoked where this process cannot see it (the CLI, another API process: here, a
    transaction of its own) is refused once that time has passed since its last lookup; a
    wrong key is looked up every time and never remembered."""

    from shared.db import unit_of_work
    from shared.tenants.service import revoke_key

    ttl = get_settings().auth_cache_seconds
    assert ttl == 5.0  # the shipped default, not a test's
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    headers = key_headers(tenant, ["read"])
    assert client.get("/v1/profiles", headers=headers).status_code == 200  # looked up now
    key_id = next(
        uuid.UUID(k["id"])
        for k in client.get("/v1/admin/keys", headers=key_headers(tenant, ["admin"])).json()
        if k["scopes"] == ["read"]
    )
    with unit_of_work() as uow:
        assert revoke_key(uow.session, key_id)
    revoked_at = time.monotonic()
    while client.get("/v1/profiles", headers=headers).status_code == 200:
        assert time.monotonic() - revoked_at < ttl + 1.0, "still accepted past the cache time"
        time.sleep(0.2)
    assert client.get("/v1/profiles", headers=headers).status_code == 401  # and stays refused
    wrong = {"Authorization": headers["Authorization"] + "x"}
    assert client.get("/v1/profiles", headers=wrong).status_code == 401


def test_a_tenant_holds_a_bounded_number_of_live_keys_and_others_are_unaffected(
    client: TestClient,
) -> None:
    """Minting a key per request would grow the key table, the listing and the per-key rate
    buckets without end: past the cap a new key is a 409 until one is revoked; another
    tenant's admin still creates keys meanwhile."""
    from shared.db import unit_of_work
    from shared.tenants.service import MAX_LIVE_KEYS_PER_TENANT, create_key

    tenant, other = f"t-{uuid.uuid4().hex[:10]}", f"t-{uuid.uuid4().hex[:10]}"
    admin = key_headers(tenant, ["admin"])
    with unit_of_work() as uow:  # the rest of the allowance, without 99 requests
        for _ in range(MAX_LIVE_KEYS_PER_TENANT - 2):
            create_key(uow.session, tenant, "bulk", ["read"])
    last = client.post("/v1/admin/keys", headers=admin, json={"scopes": ["read"]})
    assert last.status_code == 201, last.text
    refused = client.post("/v1/admin/keys", headers=admin, json={"scopes": ["read"]})
    assert refused.status_code == 409
    assert "revoke one first" in refused.json()["error"]["message"]
    assert len(client.get("/v1/admin/keys", headers=admin).json()) == MAX_LIVE_KEYS_PER_TENANT
    other_admin = key_headers(other, ["admin"])
    assert client.post("/v1/admin/keys", headers=other_admin, json={}).status_code == 201
    revoked = client.delete(f"/v1/admin/keys/{last.json()['id']}", headers=admin)
    assert revoked.status_code == 204
    again = client.post("/v1/admin/keys", headers=admin, json={"scopes": ["read"]})
    assert again.status_code == 201


def test_admin_key_endpoints_create_list_and_revoke_for_their_own_tenant(
    client: TestClient,
) -> None:
    tenant, other = f"t-{uuid.uuid4().hex[:10]}", f"t-{uuid.uuid4().hex[:10]}"
    admin = key_headers(tenant, ["admin"])
    reader = key_headers(tenant, ["read"])
    other_admin = key_headers(other, ["admin"])
    assert client.post("/v1/admin/keys", headers=reader, json={}).status_code == 403
    created = client.post("/v1/admin/keys", headers=admin, json={"scopes": ["read"]})
    assert created.status_code == 201
    body = created.json()
    assert body["tenant_id"] == tenant  # an admin key mints keys for its own tenant only
    new = {"Authorization": f"Bearer {body['secret']}"}
    assert client.get("/v1/profiles", headers=new).status_code == 200
    listed = client.get("/v1/admin/keys", headers=admin).json()
    assert any(k["id"] == body["id"] and "secret" not in k for k in listed)
    assert {k["tenant_id"] for k in listed} == {tenant}
    # Another tenant's admin neither sees nor revokes it.
    assert all(
        k["id"] != body["id"] for k in client.get("/v1/admin/keys", headers=other_admin).json()
    )
    assert client.delete(f"/v1/admin/keys/{body['id']}", headers=other_admin).status_code == 404
    assert client.get("/v1/profiles", headers=new).status_code == 200
    assert client.delete(f"/v1/admin/keys/{body['id']}", headers=admin).status_code == 204
    assert client.get("/v1/profiles", headers=new).status_code == 401
    # Naming a tenant is not a field any more: unknown fields are errors, not ignored.
    smuggled = client.post("/v1/admin/keys", headers=admin, json={"tenant": other})
    assert smuggled.status_code == 422


# A valid body of every JSON write route ("JSON bodies with extra fields on every
# write route"), each of which must refuse a field it does not name.
WRITE_ROUTES = [
    ("POST", "/v1/documents", {"external_id": "x", "text": "Some text."}),
    ("POST", "/v1/search", {"query": "lighthouses"}),
    ("POST", "/v1/search/next", {"cursor": "Zm9vOjE"}),
    ("PUT", "/v1/profiles/strict-one", {"settings": {"top_k": 3}}),
    ("POST", "/v1/admin/reconcile", {"repair": False}),
    ("POST", "/v1/admin/keys", {"scopes": ["read"]}),
    (
        "POST",
        "/v1/admin/webhooks",
        {"url": "https://hooks.example.com/x", "events": ["job.indexed"]},
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITE_ROUTES, ids=[r[1] for r in WRITE_ROUTES])
def test_every_write_route_refuses_a_field_it_does_not_name(
    client: TestClient, method: str, path: str, body: dict[str, object]
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    headers = key_headers(tenant, ["read", "write", "admin"])
    answer = client.request(method, path, headers=headers, json={**body, "surprise_field": 1})
    assert answer.status_code == 422, (path, answer.status_code, answer.text)
    # One shape everywhere (the upload route said 400 bad_request and search 422 before)
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["fields"] == [
        {"path": "body.surprise_field", "message": "is not a field this request takes"}
    ], error
    assert "surprise_field is not a field this request takes" in error["message"]


def test_every_openapi_write_route_is_in_the_table() -> None:
    from services.api.app import create_app

    spec = create_app().openapi()
    routes = {
        (method.upper(), path.replace("{name}", "strict-one"))
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    }
    assert routes == {(m, p) for m, p, _ in WRITE_ROUTES}


@pytest.mark.parametrize(
    "cursor",
    [
        "bm90LWEtY3Vyc29y",  # base64 of something that is no cursor
        "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQTo5OTk",  # a well-formed id never issued
        "Y29uY29yZDpzZWFyY2gtY3Vyc29yOnRlbmFudDp4OjA",  # a forged id naming another key
    ],
)
def test_forged_cursor_ids_are_refused_without_reading_another_key(
    client: TestClient, cursor: str
) -> None:
    headers = key_headers(f"t-{uuid.uuid4().hex[:10]}", ["read"])
    answer = client.post("/v1/search/next", headers=headers, json={"cursor": cursor})
    assert answer.status_code in (400, 404), answer.text
    assert "Redis" not in answer.text and "WRONGTYPE" not in answer.text
