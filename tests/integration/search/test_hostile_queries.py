"""One tenant's hostile or unlucky searches do not harm another's: bodies are bounded before
anything parses them (no key needed to send one), a paginated search cannot park megabytes
in Redis (the broker too), and a search that meets a stalled Postgres answers from the other
arm, marked degraded, within the shipped store timeout, while other tenants' searches go on."""

from __future__ import annotations

import random
import string
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from shared.db import unit_of_work
from shared.settings import get_settings
from shared.stores import repository as stores_repo
from shared.tenants.admission import search_slots
from tests.helpers import key_headers, search, upload_text, wait_converged, wait_job

DOCS = {
    "okapi": ("The okapi lives only in the Ituri rainforest.", "zoo"),
    "bees": ("Honey bees tell each other where flowers are with the waggle dance.", "zoo"),
    "pump": ("Fault code XQ-4471-B means the impeller is blocked.", "ops"),
}


@pytest.fixture
def corpus(client: TestClient, auth: dict[str, str], tenant: str, worker: Any) -> None:
    for external_id, (body, team) in DOCS.items():
        up = upload_text(client, auth, external_id, body, metadata={"team": team})
        wait_job(client, auth, up["job_id"])
    wait_converged(tenant)


def _noise(chars: int) -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=chars))


def test_request_bodies_are_bounded_before_the_key_is_checked(
    client: TestClient, auth: dict[str, str], tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = get_settings()
    limit = settings.max_request_bytes
    # The suite's upload limit is smaller than the request limit; the shipped one is larger.
    monkeypatch.setattr(settings, "max_upload_bytes", 4 * limit)
    big = b'{"query": "' + b"x" * (limit + 1) + b'"}'

    # No key at all: refused for its size, before it is read whole or parsed.
    declared = client.post("/v1/search", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["code"] == "payload_too_large"
    assert "X-Request-ID" in declared.headers

    def chunked() -> Iterator[bytes]:  # no Content-Length: read only up to the limit
        for _ in range(64):
            yield b"x" * (64 * 1024)

    streamed = client.post(
        "/v1/search", content=chunked(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413, streamed.text
    admin = key_headers(tenant, ["read", "write", "admin"])
    profile = client.put("/v1/profiles/big", content=big, headers=admin)
    assert profile.status_code == 413

    # Uploads keep their own, larger limit, checked by their route while it streams: a body
    # over the request limit reaches the route (which refuses its NUL here).
    upload = client.post(
        "/v1/documents",
        content=b'{"external_id": "a", "text": "\\u0000' + b"y" * (limit + 1) + b'"}',
        headers={**auth, "content-type": "application/json"},
    )
    assert upload.status_code == 422, upload.text
    # An ordinary search is untouched by the limit.
    assert client.post("/v1/search", json={"query": "okapi"}, headers=auth).status_code == 200


def test_a_paginated_search_cannot_park_megabytes_in_redis(
    client: TestClient, auth: dict[str, str], corpus: None
) -> None:
    """Each cursor keeps the whole request: filter values of random text barely compress."""
    from shared.search.cursors import MAX_SNAPSHOT_BYTES

    teams = ["zoo", *(_noise(9000) for _ in range(99))]  # about 900 KB, under the body limit
    body = {"query": "forest", "top_k": 1, "paginate": True}
    response = client.post(
        "/v1/search", json={**body, "filters": {"metadata": {"team": teams}}}, headers=auth
    )
    assert response.status_code == 400, response.text
    assert f"the limit is {MAX_SNAPSHOT_BYTES}" in response.json()["error"]["message"]
    # The same search with filters of ordinary size pages as before.
    page = search(
        client, auth, "forest", top_k=1, paginate=True, filters={"metadata": {"team": teams[:3]}}
    )
    assert page["next_cursor"]


def test_a_stalled_postgres_degrades_the_search_within_the_default_timeout_and_spares_others(
    client: TestClient, auth: dict[str, str], tenant: str, corpus: None, monkeypatch: Any
) -> None:
    """Tenant A's dense arm meets a Postgres that does not answer (a statement that sleeps a
    minute). Under the shipped ``search_store_timeout_s`` Postgres cancels it and A gets the
    lexical arm's results, marked ``dense_unavailable``; meanwhile more of A's searches than
    the API has cores are sent: those beyond A's share of the API process wait briefly for
    one of A's own slots and are answered 429 with Retry-After (never holding a thread), and
    tenant B's searches still answer at once."""
    settings = get_settings()
    timeout_s = settings.search_store_timeout_s
    assert timeout_s == 10.0  # the shipped default: this test uses no shortened setting
    other = f"{tenant}-b"
    other_auth = key_headers(other, ["read", "write"])
    upload_text(client, other_auth, "b", "Okapi sightings in the Ituri forest.")
    wait_converged(other)

    original = stores_repo.nearest_chunks

    def stalled(session: Any, tenant_id: str, *args: Any, **kwargs: Any) -> Any:
        if tenant_id == tenant:
            session.execute(text("SELECT pg_sleep(60)"))
        return original(session, tenant_id, *args, **kwargs)

    monkeypatch.setattr(stores_repo, "nearest_chunks", stalled)
    answers: list[tuple[float, Any]] = []

    def stalled_search() -> None:
        started = time.monotonic()
        answer = client.post("/v1/search", json={"query": "XQ-4471-B"}, headers=auth)
        answers.append((time.monotonic() - started, answer))

    threads = [threading.Thread(target=stalled_search) for _ in range(6)]  # > 4 dense threads
    for t in threads:
        t.start()
    time.sleep(1.0)
    for mode in ("lexical", "hybrid", "dense"):
        started = time.monotonic()
        theirs = search(client, other_auth, "okapi forest", mode=mode)
        assert time.monotonic() - started < 3.0, mode
        assert theirs["results"] and theirs["results"][0]["external_id"] == "b"
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 6
    served = [(took, a.json()) for took, a in answers if a.status_code == 200]
    refused = [(took, a) for took, a in answers if a.status_code != 200]
    assert len(served) >= search_slots(settings), answers
    for took, body in served:
        assert body["degraded"] == ["dense_unavailable"]
        assert body["results"][0]["external_id"] == "pump"  # the lexical arm's
        assert took < timeout_s + 4
    for took, answer in refused:  # waited for one of A's slots, then turned away
        assert answer.status_code == 429 and answer.headers["Retry-After"], answer.text
        assert took < settings.search_admission_wait_s + 2
    with unit_of_work() as uow:  # cancelled by Postgres, not left running
        sleeping = uow.session.scalar(
            text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(60)%'")
        )
    assert sleeping == 0
