"""Tenant isolation under adversarial, randomized requests (hypothesis).

Two tenants hold identical documents (same external ids, file names, titles and chunk texts).
Every read path is exercised with tenant A's key, with hostile query text and with tenant B's
own ids; A must never see anything of B's, B's ids must answer 404, and nothing may answer 5xx.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import key_headers, upload_text, wait_converged, wait_job

DOCS = {
    "handbook.md": "# Safety\nWear goggles in the lab. Report spills at once.\n# Leave\nAsk HR.",
    "pump.txt": "Fault code XQ-4471-B means the impeller is blocked.",
    "notes.txt": "The okapi lives in the Ituri rainforest and eats leaves.",
}
HOSTILE_QUERIES = [
    "*",
    "?",
    "tenant_id:*",
    "tenant_id:{other}",
    "{other}",
    "' OR 1=1 --",
    '"; DROP TABLE chunks; --',
    "text:* AND NOT tenant_id:x",
    "(goggles OR impeller) AND _id:*",
    "\\\\ // {} [] ^ ~ : !",
    "%' UNION SELECT * FROM api_keys --",
    '{"query_string": {"query": "*"}}',
    "impeller",
    "goggles spills",
]


def _tenant_with_docs(client: TestClient) -> dict[str, Any]:
    tenant = f"iso-{uuid.uuid4().hex[:10]}"
    auth = key_headers(tenant, ["read", "write"])
    documents, jobs = [], []
    for name, text in DOCS.items():
        up = upload_text(client, auth, name, text, title="Shared title")
        documents.append(up["document_id"])
        jobs.append(up["job_id"])
    for job in jobs:
        wait_job(client, auth, job)
    chunks = wait_converged(tenant)
    return {"tenant": tenant, "auth": auth, "documents": documents, "jobs": jobs, "chunks": chunks}


@pytest.fixture(scope="module")
def tenants(client: TestClient, worker) -> tuple[dict[str, Any], dict[str, Any]]:
    return _tenant_with_docs(client), _tenant_with_docs(client)


def _ids_in(body: Any) -> set[str]:
    """Every string anywhere in a response body (ids hide in nested fields)."""
    if isinstance(body, dict):
        return {s for v in body.values() for s in _ids_in(v)} | {
            k for k in body if isinstance(k, str)
        }
    if isinstance(body, list):
        return {s for v in body for s in _ids_in(v)}
    return {body} if isinstance(body, str) else set()


def _request(client: TestClient, a: dict[str, Any], b: dict[str, Any], choice: dict[str, Any]):
    kind = choice["kind"]
    own_or_other = b if choice["target_other"] else a
    doc = own_or_other["documents"][choice["index"] % len(DOCS)]
    if kind == "search":
        query = choice["query"].replace("{other}", choice["other_token"](b))
        body = {"query": query, "mode": choice["mode"], "top_k": 20, "explain": True}
        if choice["filter_other_docs"]:
            body["filters"] = {"document_ids": b["documents"]}
        return client.post("/v1/search", headers=a["auth"], json=body), "search"
    if kind == "get":
        return client.get(f"/v1/documents/{doc}", headers=a["auth"]), "get"
    if kind == "browse":
        return client.get(f"/v1/documents/{doc}/chunks", headers=a["auth"]), "browse"
    if kind == "list":
        return client.get("/v1/documents?limit=50", headers=a["auth"]), "list"
    if kind == "job":
        job = own_or_other["jobs"][choice["index"] % len(DOCS)]
        return client.get(f"/v1/jobs/{job}", headers=a["auth"]), "job"
    if kind == "delete":  # only ever aimed at B: it must 404 and delete nothing
        other_doc = b["documents"][choice["index"] % len(DOCS)]
        return client.delete(f"/v1/documents/{other_doc}", headers=a["auth"]), "delete"
    if kind == "admin":  # reconcile / reindex are operator-only: a tenant key gets 403
        return client.post("/v1/admin/reconcile", headers=a["auth"], json={}), "admin"
    raise AssertionError(kind)


choices = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["search", "get", "browse", "list", "job", "delete", "admin"]),
        "target_other": st.booleans(),
        "index": st.integers(0, 10),
        "mode": st.sampled_from(["dense", "lexical", "hybrid"]),
        "query": st.one_of(st.sampled_from(HOSTILE_QUERIES), st.text(min_size=1, max_size=80)),
        "filter_other_docs": st.booleans(),
        "other_token": st.sampled_from(
            [
                lambda b: b["tenant"],
                lambda b: b["documents"][0],
                lambda b: next(iter(b["chunks"])),
                lambda b: b["jobs"][0],
            ]
        ),
    }
)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(choice=choices)
def test_no_request_of_tenant_a_ever_reveals_tenant_b(
    client: TestClient, tenants: tuple[dict[str, Any], dict[str, Any]], choice: dict[str, Any]
) -> None:
    a, b = tenants
    response, kind = _request(client, a, b, choice)
    assert response.status_code < 500, (kind, choice, response.text)
    b_ids = {b["tenant"], *b["documents"], *b["jobs"], *b["chunks"]}
    if kind == "admin":
        assert response.status_code == 403
        return
    if kind == "delete" or (kind in ("get", "browse", "job") and choice["target_other"]):
        assert response.status_code == 404, (kind, response.text)
        assert response.json()["error"]["code"] == "not_found"
        return
    if response.status_code != 200:  # e.g. a 422 for a query of only whitespace
        assert response.status_code in (400, 422), (kind, response.text)
        return
    leaked = _ids_in(response.json()) & b_ids
    # A hostile query may echo B's id back as the query text itself; that is not a leak.
    if kind == "search":
        leaked.discard(response.json()["query"])
    assert not leaked, (kind, choice, leaked)


def test_tenant_b_is_intact_after_the_attack(
    client: TestClient, tenants: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    _, b = tenants
    listed = client.get("/v1/documents", headers=b["auth"]).json()["documents"]
    assert sorted(d["id"] for d in listed) == sorted(b["documents"])
    assert wait_converged(b["tenant"]) == b["chunks"]
