"""Deletes that cannot hit live data (issue 19): a delete is checked against Postgres when
the relay applies it, and a stale-copy cleanup never blocks the write of a newer version."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.ingest import pipeline, relay
from shared.ingest import repository as repo
from shared.models import OutboxOp
from tests.conftest import CeleryProcess
from tests.helpers import (
    es_chunks,
    long_text,
    paused,
    pg_chunks,
    search,
    upload_text,
    wait_converged,
)


def test_a_purge_decided_before_a_write_landed_leaves_the_live_copy(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """Reconcile read Postgres before a chunk's commit and Elasticsearch after its relay, so
    it took the live copy for an orphan and queued a purge at the document's version."""
    upload = upload_text(client, auth, "race.txt", long_text("lapwing", 8))
    live = wait_converged(tenant)
    with paused(worker):
        with unit_of_work() as uow:
            for chunk_id, version in live.items():
                repo.add_outbox(
                    uow.session,
                    tenant_id=tenant,
                    document_id=uuid.UUID(upload["document_id"]),
                    op=OutboxOp.PURGE,
                    version=version,
                    chunk_ids=[chunk_id],
                )
        relay.drain()
        assert es_chunks(tenant) == live == pg_chunks(tenant)


def test_a_stale_copy_cleanup_never_blocks_the_next_versions_write(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """Delete a document and upload it again within the relay lag; a search meets the old
    copy and queues its cleanup before the new version's write reaches Elasticsearch."""
    first = upload_text(client, auth, "phoenix.txt", "The ibis nests in reeds by the lake.")
    wait_converged(tenant)
    with paused(worker):
        deleted = client.delete(f"/v1/documents/{first['document_id']}", headers=auth)
        assert deleted.status_code == 200, deleted.text
        again = upload_text(client, auth, "phoenix.txt", "The ibis nests in reeds by the lake.")
        assert again["version"] == 3 and again["status"] == "accepted"
        # Elasticsearch still holds version 1; the search drops it and queues its cleanup.
        body = search(client, auth, "ibis nests", mode="lexical")
        assert body["results"] == [] and body["dropped_stale"] >= 1
        relay.drain()  # the tombstone's deletes and the cleanup reach Elasticsearch first
        assert pipeline.process_job(uuid.UUID(again["job_id"])).state == "indexed"
        relay.drain()
        assert set(es_chunks(tenant).values()) == {3} == set(pg_chunks(tenant).values())
    hits = search(client, auth, "ibis nests", mode="lexical")["results"]
    assert [h["document_id"] for h in hits] == [first["document_id"]]
