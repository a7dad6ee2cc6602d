"""An upload becomes searchable through both arms, on real services."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers import (
    document_count,
    es_chunks,
    pg_chunks,
    upload_text,
    wait_converged,
    wait_job,
)

OKAPI = (
    "The okapi is a shy forest giraffid that lives only in the Ituri rainforest of the "
    "Democratic Republic of the Congo. Its legs carry horizontal white stripes like a zebra's, "
    "yet its closest living relative is the giraffe. Keepers feed it leaves, fruit and clay."
)
KETTLE = (
    "Descaling an electric kettle: fill it with equal parts white vinegar and water, boil, "
    "leave it for an hour, then rinse several times. Limescale builds up faster in hard water."
)


def test_upload_becomes_searchable_through_both_arms(client: TestClient, auth, tenant, worker):
    first = upload_text(client, auth, "okapi.txt", OKAPI, title="Forest animals")
    upload_text(client, auth, "kettle.txt", KETTLE, title="Household tips")
    assert first["status"] == "accepted" and first["version"] == 1
    job = wait_job(client, auth, first["job_id"])
    assert job["detail"]["chunks"] >= 1
    assert set(job["stage_timings"]) >= {"parse", "chunk", "embed", "write"}
    wait_converged(tenant)

    # An exact rare term: BM25 finds it (and the dense arm may too).
    rare = client.post("/v1/search", headers=auth, json={"query": "Ituri", "top_k": 3}).json()
    assert rare["results"][0]["external_id"] == "okapi.txt"
    assert "lexical" in rare["results"][0]["found_by"]

    # A paraphrase sharing no word with the text: only the dense arm can find it.
    paraphrase = (
        "which banded hoofed creature akin to tall savanna browsers hides deep in equatorial "
        "woodland"
    )
    lexical = client.post(
        "/v1/search", headers=auth, json={"query": paraphrase, "mode": "lexical"}
    ).json()
    assert all(r["external_id"] != "okapi.txt" for r in lexical["results"])
    hybrid = client.post(
        "/v1/search", headers=auth, json={"query": paraphrase, "explain": True}
    ).json()
    top = hybrid["results"][0]
    assert top["external_id"] == "okapi.txt"
    assert top["found_by"] == ["dense"]
    assert top["trace"]["dense"]["rank"] == 1 and top["trace"]["lexical"] is None
    assert top["score"] > 0
    assert hybrid["degraded"] == []


def test_same_chunks_in_postgres_and_elasticsearch(client: TestClient, auth, tenant, worker):
    long_text = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(300))
    job = upload_text(client, auth, "long.txt", long_text)
    wait_job(client, auth, job["job_id"])
    pg = wait_converged(tenant)
    assert len(pg) > 3, "a long text is split into several chunks"
    assert es_chunks(tenant) == pg_chunks(tenant) == pg
    assert all(version == 1 for version in pg.values())


def test_bad_input_is_rejected_and_nothing_is_written(client: TestClient, auth, tenant):
    empty = client.post(
        "/v1/documents", headers={**auth, "content-type": "application/json"}, content=b""
    )
    assert empty.status_code == 400
    assert empty.json()["error"]["code"] == "bad_request"

    wrong_type = client.post(
        "/v1/documents", headers={**auth, "content-type": "image/png"}, content=b"\x89PNG...."
    )
    assert wrong_type.status_code == 415
    assert "error" in wrong_type.json()

    bad_file = client.post(
        "/v1/documents", headers=auth, files={"file": ("photo.png", b"\x89PNG\r\n", "image/png")}
    )
    assert bad_file.status_code == 415

    too_big = client.post(
        "/v1/documents",
        headers=auth,
        files={"file": ("big.txt", b"a" * (300 * 1024), "text/plain")},
    )
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "payload_too_large"

    missing_field = client.post("/v1/documents", headers=auth, json={"text": "no id"})
    assert missing_field.status_code == 422  # as every body that fails its schema
    assert "external_id" in missing_field.json()["error"]["message"]

    assert document_count(tenant) == 0


def test_file_upload_and_requests_without_key(client: TestClient, auth, tenant, worker):
    response = client.post(
        "/v1/documents",
        headers=auth,
        files={"file": ("notes.md", b"# Notes\nQuokkas smile a lot.", "text/markdown")},
        data={"title": "Notes", "metadata": '{"team": "ops"}'},
    )
    assert response.status_code == 202, response.text
    job = wait_job(client, auth, response.json()["job_id"])
    assert job["state"] == "indexed"
    assert client.post("/v1/search", json={"query": "quokka"}).status_code == 401
    assert (
        client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )
