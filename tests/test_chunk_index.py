"""The chunk index's contract (shared/stores/chunk_index.py), against the real store: what the
relay, reconciliation, search, the admin stats and readiness rely on it for. A second
implementation (another search engine) would be added to IMPLEMENTATIONS and pass the same
tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.models import Chunk
from shared.reconcile import repository as reconcile_repo
from shared.stores.chunk_index import ChunkIndex, ElasticsearchChunkIndex
from tests.helpers import key_headers, upload_text, wait_converged, wait_job

IMPLEMENTATIONS: list[Callable[[], ChunkIndex]] = [ElasticsearchChunkIndex]


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda make: make.__name__)
def index(request: pytest.FixtureRequest) -> ChunkIndex:
    make: Callable[[], ChunkIndex] = request.param
    return make()


def _ingest(client: TestClient, auth: dict[str, str], tenant: str) -> dict[str, tuple[int, int]]:
    """Three documents indexed in both stores: chunk id -> (version, fingerprint) in Postgres."""
    for i in range(3):
        up = upload_text(client, auth, f"contract-{i}", f"Contract note {i} on tidal flats.")
        wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.id, Chunk.version, Chunk.fingerprint).where(Chunk.tenant_id == tenant)
        ).all()
    return {cid: (version, fp) for cid, version, fp in rows}


def test_bucket_sums_agree_with_postgres_when_the_stores_agree(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object, index: ChunkIndex
) -> None:
    _ingest(client, auth, tenant)
    index.refresh()
    assert tenant in index.tenants()
    stats, unbucketed = index.bucket_stats(tenant)
    with unit_of_work() as uow:
        assert stats == reconcile_repo.bucket_stats(uow.session, tenant)
    assert unbucketed == 0
    assert index.bucket_stats("no-such-tenant") == ({}, 0)


def test_copies_carry_their_version_and_a_fingerprint_that_matches_their_fields(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object, index: ChunkIndex
) -> None:
    pg = _ingest(client, auth, tenant)
    index.refresh()
    stats, _ = index.bucket_stats(tenant)
    copies = index.copies_in_buckets(tenant, sorted(stats))
    assert set(copies) == set(pg)
    for chunk_id, copy in copies.items():
        version, fingerprint = pg[chunk_id]
        assert (copy.tenant_id, copy.version) == (tenant, version)
        assert copy.stored_fingerprint == copy.fields_fingerprint == fingerprint
        assert copy.es_version == version  # written with the Postgres version, external
    assert index.copies_in_buckets(tenant, []) == {}
    # By id, whatever the tenant, in pages: the same copies.
    by_id = index.copies_by_ids([*pg, "absent:0"], page=1)
    assert by_id == copies


def test_lexical_search_and_counts_stay_within_the_tenant(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object, index: ChunkIndex
) -> None:
    pg = _ingest(client, auth, tenant)
    other = f"{tenant}-other"
    other_auth = key_headers(other, ["read", "write"])
    up = upload_text(client, other_auth, "contract-x", "Contract note on tidal flats, too.")
    wait_job(client, other_auth, up["job_id"])
    wait_converged(other)
    index.refresh()
    match = {"match": {"text": "tidal flats"}}
    hits = index.lexical_search(tenant, match, [], size=10)
    assert {chunk_id for chunk_id, _ in hits} == set(pg)
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)
    assert index.lexical_search(tenant, match, [], size=1) == hits[:1]
    assert index.count_of_tenant(tenant) == len(pg) and index.count_of_tenant(other) == 1
    assert index.count_of_tenant(None) >= len(pg) + 1
    assert index.cluster_status(timeout_s=2) in ("green", "yellow")


def test_a_bulk_write_answers_per_item_and_exists_sees_it(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object, index: ChunkIndex
) -> None:
    [chunk_id] = list(_ingest(client, auth, tenant))[:1]
    stale = {"index": {"_id": chunk_id, "version": 1, "version_type": "external"}}
    response = index.bulk([stale, {"tenant_id": tenant, "text": "older"}])
    [item] = response["items"]
    assert item["index"]["status"] == 409  # the same version again: refused, per item
    assert index.exists(chunk_id) and not index.exists("absent:0")
    assert index.reindex_target() is None
