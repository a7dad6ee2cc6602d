"""Tenants cannot see each other through BM25's statistics: a tenant's lexical scores, its
rankings and everything its responses carry are a function of its own documents only,
whatever another tenant ingests, updates or deletes (each tenant's copies are in an index of
its own: shared/stores/es_index.py)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.documents.schemas import Upload
from shared.documents.service import accept_upload
from shared.ingest import pipeline
from shared.reconcile.reindex import reindex
from shared.relay import service as relay
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from shared.stores.es_index import index_body, tenant_alias
from shared.stores.vector_store import PgVectorStore
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import (
    key_headers,
    outbox_empty,
    paused,
    pg_chunks,
    search,
    upload_text,
    wait_converged,
    wait_job,
)

RARE = "zyxquorbite"
QUERIES = [f"{RARE} deposits", "mineral deposits in caves", "how do caves form"]
MODES = ("lexical", "hybrid", "dense")


def _answers(client: TestClient, auth: dict[str, str]) -> list[dict[str, Any]]:
    """Every response of the tenant's searches, with traces and evidence, as data: all of it
    but the wall-clock timings (whose stages are compared, not their milliseconds)."""
    answers = []
    for query in QUERIES:
        for mode in MODES:
            body = search(client, auth, query, mode=mode, explain=True, top_k=10)
            body["timings_ms"] = sorted(body["timings_ms"])
            answers.append(body)
    return answers


def _ingest(client: TestClient, auth: dict[str, str], tenant: str, texts: dict[str, str]) -> None:
    for external_id, text in texts.items():
        up = upload_text(client, auth, external_id, text, title=f"Note {external_id}")
        if up["status"] == "accepted":
            wait_job(client, auth, up["job_id"])
    wait_converged(tenant)


def test_another_tenants_uploads_updates_and_deletes_change_nothing_in_a_tenants_answers(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    _ingest(
        client,
        auth,
        tenant,
        {
            "a-1": f"The cave held {RARE} deposits along its northern wall.",
            "a-2": "Mineral deposits in caves grow from dripping water over centuries.",
            "a-3": "Caves form where slightly acidic water dissolves limestone.",
        },
    )
    before = _answers(client, auth)
    top = before[0]["results"][0]
    assert top["external_id"] == "a-1" and top["trace"]["lexical"]["rank"] == 1

    other = f"{tenant}-b"
    other_auth = key_headers(other, ["read", "write"])
    # Forty documents that share the rare word (its document frequency, were statistics
    # shared, would go from 1 to 41) and the other query terms, of other lengths.
    texts = {
        f"b-{i}": f"{RARE} " * (1 + i % 5) + f"deposits in caves, report {i}, " + "filler " * i
        for i in range(40)
    }
    _ingest(client, other_auth, other, texts)
    assert _answers(client, auth) == before

    # Updates and deletes of the other tenant's documents change nothing either.
    _ingest(client, other_auth, other, {f"b-{i}": f"Revised {RARE} note {i}." for i in range(10)})
    listed = client.get("/v1/documents", headers=other_auth, params={"limit": 1000}).json()
    by_external = {d["external_id"]: d["id"] for d in listed["documents"]}
    for i in range(10, 25):
        gone = client.delete(f"/v1/documents/{by_external[f'b-{i}']}", headers=other_auth)
        assert gone.status_code == 200
    wait_converged(other)
    assert _answers(client, auth) == before


def test_each_tenant_has_an_index_of_its_own_with_one_shard(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    up = upload_text(client, auth, "own.txt", "A note in its own index.")
    wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    es, settings = get_es(), get_settings()
    [index] = es.indices.get_alias(name=tenant_alias(settings, tenant))
    assert index.endswith(f"-t-{tenant}")
    assert (
        es.indices.get_settings(index=index)[index]["settings"]["index"]["number_of_shards"] == "1"
    )
    held = es.search(index=index, size=100, query={"match_all": {}})["hits"]["hits"]
    assert held and {h["_source"]["tenant_id"] for h in held} == {tenant}
    # The read alias covers it, for what spans tenants (counts, lookups by id).
    assert index in es.indices.get_alias(name=settings.es_chunks_alias())


def test_the_shared_index_of_an_older_deployment_moves_to_an_index_per_tenant_online(
    tenant: str, worker: CeleryProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older deployment kept every tenant in one index. It keeps working on that layout
    (searches filter by tenant) until ``concord reindex`` moves it to an index per tenant:
    online (writes during the move reach both layouts, searches keep answering) and
    resumable (an interrupted move goes on where it stopped)."""
    settings = get_settings().model_copy(
        update={"es_index_prefix": f"{get_settings().es_index_prefix}-legacy{uuid.uuid4().hex[:6]}"}
    )
    es = get_es()
    index = ElasticsearchChunkIndex(es, settings)
    alias = settings.es_chunks_alias()
    shared = f"{alias}-v1"
    # The layout as the code before this one created it: one index, the alias its write index.
    es.indices.create(index=shared, **index_body(settings))
    es.indices.put_alias(index=shared, name=alias, is_write_index=True)
    tenants = [tenant, f"{tenant}-2"]

    def ingest(tenant_id: str, external_id: str, text: str) -> None:
        with unit_of_work() as uow:
            upload = Upload(tenant_id, external_id, text.encode(), "text/plain")
            result = accept_upload(uow, settings, upload, queue=None)
        assert result.job_id is not None
        assert pipeline.process_job(connect(), unit_of_work, result.job_id).state == "indexed"
        relay.drain(replace(connect(), index=index), unit_of_work, settings=settings)

    # Postgres holds every other test's tenants too, which this layout never had: the move
    # copies these two tenants' chunks only (pages of theirs, in the same id order).
    real_page_after = PgVectorStore.page_after

    def pages_of_ours(
        store: PgVectorStore, last: str, size: int, tenant_id: str | None = None
    ) -> list[Any]:
        while page := real_page_after(store, last, size, tenant_id):
            if ours := [(c, d) for c, d in page if c.tenant_id in tenants]:
                return ours
            last = page[-1][0].id
        return []

    monkeypatch.setattr(PgVectorStore, "page_after", pages_of_ours)
    # Other tests' writes have all reached their own layout: this test's relay sends only its own.
    wait_for(outbox_empty, 60, what="the outbox to drain")
    try:
        with paused(worker):  # this test's relay is the only one writing to this layout
            for t in tenants:
                for i in range(4):
                    ingest(t, f"n-{i}", f"Tenant {t} note {i} about {RARE} and basalt.")
            index.refresh()
            assert not index.per_tenant()
            assert {cid for cid, _ in index.lexical_search(tenant, RARE, None, 50)} == set(
                pg_chunks(tenant)
            )

            class Interrupted(Exception):
                pass

            def written_during_the_move_then_interrupted(done: int, total: int) -> None:
                ingest(tenant, "during", f"Written during the move: {RARE} in gneiss.")
                index.refresh()
                assert index.lexical_search(tenant, "gneiss", None, 5)  # still answering
                raise Interrupted

            with pytest.raises(Interrupted):
                reindex(
                    replace(connect(), index=index),
                    unit_of_work,
                    written_during_the_move_then_interrupted,
                    page_size=3,
                )
            assert index.reindex_target() is not None and not index.per_tenant()
            result = reindex(replace(connect(), index=index), unit_of_work, page_size=1000)
            assert result.resumed and shared in result.old_indices
            assert not es.indices.exists(index=shared)
            _layout_cache_expires()
            assert index.per_tenant() and index.reindex_target() is None
            for t in tenants:
                [own] = es.indices.get_alias(name=tenant_alias(settings, t))
                assert own.endswith(f"-t-{t}")
                with unit_of_work() as uow:
                    assert index.bucket_stats(t) == (PgVectorStore(uow.session).bucket_stats(t), 0)
            assert len(pg_chunks(tenant)) == 5
            hits = {cid for cid, _ in index.lexical_search(tenant, RARE, None, 50)}
            assert hits == set(pg_chunks(tenant))
            # New writes go to the tenant's own index.
            ingest(tenant, "after", f"Written after the move: {RARE} in schist.")
            index.refresh(tenant)
            assert len(index.lexical_search(tenant, "schist", None, 5)) == 1
    finally:
        es.indices.delete(index=f"{alias}-*", allow_no_indices=True)
        if es.indices.exists_index_template(name=alias):
            es.indices.delete_index_template(name=alias)


def _layout_cache_expires() -> None:
    from shared.stores import chunk_index

    chunk_index._layout.clear()


def test_a_copy_in_another_tenants_index_is_found_and_deleted_from_there(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    """A copy of tenant A's chunk that ended up in tenant B's index (written there out of
    band) is B's drift: B's searches never show it (they filter by tenant too), and B's
    reconcile deletes it from B's index while A's own copy stays."""
    from shared.reconcile.service import reconcile, reconcile_and_verify
    from tests.helpers import tenant_index

    up = upload_text(client, auth, "mine.txt", f"Tenant A's own note on {RARE} and basalt.")
    wait_job(client, auth, up["job_id"])
    [chunk] = wait_converged(tenant)
    other = f"{tenant}-b"
    other_auth = key_headers(other, ["read", "write"])
    es = get_es()
    copy = es.get(index=tenant_index(tenant), id=chunk)
    es.index(
        index=tenant_index(other),
        id=chunk,
        document=copy["_source"],
        version=copy["_version"],
        version_type="external",
        refresh=True,
    )
    assert search(client, other_auth, RARE, mode="lexical")["results"] == []
    found = reconcile(connect(), unit_of_work, other)
    assert found.drift["wrong_tenant"] == {chunk} and found.total() == 1
    _, after = reconcile_and_verify(connect(), unit_of_work, other)
    assert after.total() == 0
    assert not es.exists(index=tenant_index(other), id=chunk)
    assert es.exists(index=tenant_index(tenant), id=chunk)
    assert reconcile(connect(), unit_of_work, tenant).total() == 0
