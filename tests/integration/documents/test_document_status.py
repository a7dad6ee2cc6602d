"""A document's view tells the truth about its live version: the newest ingest job's state,
and where and why it failed when it did (before: a failed document looked healthy)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import wait_for
from tests.helpers import upload_text


def test_a_failed_document_shows_its_jobs_state_and_error(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    failed = client.post(
        "/v1/documents",
        headers=auth,
        files={"file": ("bark.json", b'{"title": "Bark", "colour": "grey"}', "application/json")},
        data={"external_id": "bark.json"},
    )
    assert failed.status_code == 202, failed.text
    ok = upload_text(client, auth, "moss", "Sphagnum moss holds twenty times its weight.")

    def view(document_id: str) -> dict:
        response = client.get(f"/v1/documents/{document_id}", headers=auth)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def settled(document_id: str) -> dict | None:
        body = view(document_id)
        return body if body["job"]["state"] in ("indexed", "failed", "dead_lettered") else None

    bad = wait_for(lambda: settled(failed.json()["document_id"]), 60, what="the failed job")
    assert bad["job"]["state"] in ("failed", "dead_lettered") and bad["chunk_count"] == 0
    assert bad["job"]["error"]["class"] == "ParseError"
    assert "no record has any of the text fields" in bad["job"]["error"]["message"]
    wait_for(lambda: settled(ok["document_id"]), 60, what="the indexed job")
    # read again: the view's statements each see what was committed when they ran, and the
    # job may have turned indexed between its count of chunks and its read of the job
    good = view(ok["document_id"])
    assert good["job"]["state"] == "indexed" and good["job"]["error"] is None
    assert good["job"]["version"] == good["version"] and good["chunk_count"] == 1


def test_deleted_documents_are_listed_as_tombstones_and_readable_by_request(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    """Before, a deleted document was a 404 unless one knew of ``?include_deleted=true``, and
    no list showed what was deleted."""
    kept = upload_text(client, auth, "kept", "Lichens pioneer bare rock.")
    gone = upload_text(client, auth, "gone", "Mosses hold water.")
    assert client.delete(f"/v1/documents/{gone['document_id']}", headers=auth).status_code == 200

    def listed(**params: str) -> list[dict]:
        response = client.get("/v1/documents", headers=auth, params=params)
        assert response.status_code == 200, response.text
        return list(response.json()["documents"])

    assert [(d["external_id"], d["deleted"]) for d in listed()] == [("kept", False)]
    [tombstone] = listed(deleted="true")
    assert tombstone["external_id"] == "gone" and tombstone["deleted"] is True
    assert tombstone["id"] == gone["document_id"] and tombstone["version"] == 2
    assert listed()[0]["id"] == kept["document_id"]
    assert client.get(f"/v1/documents/{gone['document_id']}", headers=auth).status_code == 404
    shown = client.get(
        f"/v1/documents/{gone['document_id']}", headers=auth, params={"include_deleted": "true"}
    )
    assert shown.status_code == 200 and shown.json()["deleted"] is True
    assert [v["tombstone"] for v in shown.json()["versions"]] == [False, True]
