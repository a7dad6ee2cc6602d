"""concord reindex: a new generation built from Postgres behind the alias, switched atomically
while searches answer, resumed where it stopped, refused copies sent again."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.settings import get_settings
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.helpers import (
    es_chunks,
    key_headers,
    pg_chunks,
    search,
    tenant_index,
    upload_text,
    wait_converged,
    wait_job,
)


def test_reindex_switches_atomically_while_searches_keep_answering(client, auth, tenant, worker):
    for i in range(8):
        upload_text(client, auth, f"atlas-{i}", f"Atlas page {i}: maps of mountain passes.")
    wait_converged(tenant)
    es, alias = get_es(), tenant_index(tenant)
    [old_index] = es.indices.get_alias(name=alias)
    result, failures = _reindex_while_searching(client, auth, "mountain passes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "drift after the switch: 0" in result.stdout
    assert failures == []
    [new_index] = es.indices.get_alias(name=alias)
    assert new_index != old_index and not es.indices.exists(index=old_index)
    assert es_chunks(tenant) == pg_chunks(tenant)
    # Writes after the switch land in the new index.
    up = upload_text(client, auth, "atlas-new", "Atlas page nine: river crossings.")
    wait_job(client, auth, up["job_id"])
    assert len(wait_converged(tenant)) == 9


def test_a_reindex_of_one_tenant_rebuilds_its_index_alone(client, auth, tenant, worker):
    """`concord reindex --tenant T`: T's index is rebuilt from T's chunks alone and switched
    while T's searches keep answering; another tenant's index is not touched."""
    other = f"t-{uuid.uuid4().hex[:12]}"
    other_auth = key_headers(other, ["read", "write"])
    for i in range(5):
        upload_text(client, auth, f"atlas-{i}", f"Atlas page {i}: maps of mountain passes.")
        upload_text(client, other_auth, f"reef-{i}", f"Reef survey {i}: coral and sponges.")
    wait_converged(tenant)
    wait_converged(other)
    es = get_es()
    [old_index] = es.indices.get_alias(name=tenant_index(tenant))
    [their_index] = es.indices.get_alias(name=tenant_index(other))
    result, failures = _reindex_while_searching(
        client, auth, "mountain passes", args=["--tenant", tenant]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"copied {len(pg_chunks(tenant))} chunks of tenant {tenant}" in result.stdout
    assert "drift after the switch: 0" in result.stdout
    assert failures == []
    [new_index] = es.indices.get_alias(name=tenant_index(tenant))
    assert new_index != old_index and not es.indices.exists(index=old_index)
    assert list(es.indices.get_alias(name=tenant_index(other))) == [their_index]
    assert es_chunks(tenant) == pg_chunks(tenant)
    assert es_chunks(other) == pg_chunks(other)
    assert search(client, other_auth, "coral sponges", mode="lexical")["results"]
    up = upload_text(client, auth, "atlas-new", "Atlas page nine: river crossings.")
    wait_job(client, auth, up["job_id"])
    assert len(wait_converged(tenant)) == 6


def test_a_reindex_of_a_tenant_that_does_not_exist_is_one_line_and_starts_nothing():
    from shared.stores.es_index import reindex_target

    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "reindex", "--tenant", "no-such-tenant"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 3, result.stdout + result.stderr  # not found
    said = " ".join(result.stderr.split())
    assert said == "not found: there is no tenant 'no-such-tenant'; check the name", said
    assert reindex_target(get_es(), get_settings()) is None


def test_reindex_changes_the_shard_count_online_and_bm25_scores_stay_the_same(
    client, auth, tenant, worker
):
    """An operator sets CONCORD_ES_SHARDS=2 and runs `concord reindex --tenant T`: the
    tenant's index comes back with two shards while searches keep answering, and lexical
    scores stay those of one shard (statistics pooled over both). Put back to one shard for
    the tests after. (One tenant's rebuild: the whole suite's chunks took 89 s to copy twice.)"""
    from shared.reconcile.reindex import reindex

    texts = ["sextant and stars", "stars over the harbour", "a sextant in the chart room"]
    for i in range(12):
        upload_text(client, auth, f"deck-{i}", f"Deck log {i}: {texts[i % 3]}, entry {i}.")
    wait_converged(tenant)
    es, alias = get_es(), tenant_index(tenant)

    def shards() -> int:
        [index] = es.indices.get_alias(name=alias)
        index_settings = es.indices.get_settings(index=index)[index]["settings"]["index"]
        return int(index_settings["number_of_shards"])

    def lexical_scores() -> dict[str, float]:
        results = search(client, auth, "sextant stars", mode="lexical", top_k=12, explain=True)[
            "results"
        ]
        return {r["chunk_id"]: r["trace"]["lexical"]["score"] for r in results}

    assert shards() == 1
    before = lexical_scores()
    result, failures = _reindex_while_searching(
        client, auth, "sextant", {"CONCORD_ES_SHARDS": "2"}, args=["--tenant", tenant]
    )
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert failures == []
        assert shards() == 2
        assert es_chunks(tenant) == pg_chunks(tenant)
        after = lexical_scores()
        assert set(after) == set(before)
        for chunk_id, score in before.items():
            assert after[chunk_id] == pytest.approx(score, rel=1e-5)
    finally:
        # this process's settings: one shard, as the other tests expect
        reindex(connect(), unit_of_work, tenant_id=tenant)
    assert shards() == 1


def test_an_interrupted_reindex_resumes_where_it_stopped(client, auth, tenant, worker):
    from shared.reconcile.reindex import reindex
    from shared.stores.es_index import anchor_index, reindex_target

    for i in range(6):
        upload_text(client, auth, f"log-{i}", f"Ship log entry {i}: calm seas.")
    wait_converged(tenant)

    class Interrupted(Exception):
        pass

    def crash_after_first_page(done: int, total: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        reindex(connect(), unit_of_work, crash_after_first_page, page_size=3)
    settings = get_settings()
    target = reindex_target(get_es(), settings)
    assert target is not None
    anchor = anchor_index(settings, target)  # the generation's progress is on its anchor
    meta = get_es().indices.get_mapping(index=anchor)[anchor]["mappings"]["_meta"]
    assert meta["reindex_last_id"]
    # An index a switch left behind no alias (it stopped before deleting the old ones): the
    # resumed reindex deletes it first.
    dead = f"{settings.es_chunks_alias()}-g1-t-{tenant}"
    get_es().indices.create(index=dead)
    # Resumed in larger pages: the index holds every tenant's chunks (tens of thousands by the
    # time the suite gets here), which pages of 3 would copy one mapping update at a time.
    result = reindex(connect(), unit_of_work, page_size=1000)
    assert not get_es().indices.exists(index=dead)
    assert result.resumed and result.new_index == target
    assert reindex_target(get_es(), settings) is None
    assert es_chunks(tenant) == pg_chunks(tenant)


def test_a_generation_is_made_as_its_anchor_says_and_discarded_once_the_settings_differ():
    """The process that starts a reindex decides the next generation's shape (here two
    shards); a relay configured otherwise (one shard, the other lexical analysis) makes its
    tenants' indices of that generation like the rest through its dual writes. Resumed under
    the same settings the generation goes on; resumed once they differ it is discarded and a
    reindex starts again, instead of switching to indices unlike the configured ones."""
    from shared.stores.chunk_index import ElasticsearchChunkIndex
    from shared.stores.es_index import chunks_prefix, reindex_target
    from shared.stores.es_index import tenant_index as index_in
    from tests.helpers import orphan_copy

    es, settings = get_es(), get_settings()
    assert settings.es_shards == 1 and settings.lexical_analysis == "python-english"
    two_shards = settings.model_copy(update={"es_shards": 2})
    relay_settings = settings.model_copy(
        update={"es_shards": 1, "lexical_analysis": "elasticsearch"}
    )
    tenant = f"shape-{uuid.uuid4().hex[:8]}"
    chunk_id, copy = orphan_copy(tenant, "Tides are charted twice a day.")
    generations = []

    def shape(index: str) -> tuple[int, str, bool, bool]:
        found = es.indices.get(index=index)[index]
        fields = found["mappings"]["properties"]
        return (
            int(found["settings"]["index"]["number_of_shards"]),
            found["mappings"]["_meta"]["lexical_analysis"],
            fields["text"].get("index", True),
            fields["stemmed"]["properties"]["text"].get("index", True),
        )

    try:
        start = ElasticsearchChunkIndex(settings=two_shards).start_reindex()
        generations.append(start.generation)
        assert not start.resumed and start.started_again_because is None
        relay = ElasticsearchChunkIndex(settings=relay_settings)
        relay.bulk_to(start.generation, [(tenant, [{"index": {"_id": chunk_id}}, copy])])
        made = index_in(settings, start.generation, tenant)
        assert shape(made) == (2, "python-english", False, True)

        again = ElasticsearchChunkIndex(settings=two_shards).start_reindex()
        assert again.resumed and again.generation == start.generation
        assert es.indices.exists(index=made)

        anew = ElasticsearchChunkIndex(settings=settings).start_reindex()
        generations.append(anew.generation)
        assert not anew.resumed and anew.generation != start.generation
        assert anew.started_again_because == (
            f"generation {start.generation} was being built with "
            "CONCORD_ES_SHARDS=2 (configured now: 1)"
        )
        assert not es.indices.exists(index=made)
        assert reindex_target(es, settings) == anew.generation
        relay.bulk_to(anew.generation, [(tenant, [{"index": {"_id": chunk_id}}, copy])])
        assert shape(index_in(settings, anew.generation, tenant)) == (
            1,
            "python-english",
            False,
            True,
        )
    finally:  # the live indices stay as they were; the generations built here go
        for generation in generations:
            for index in es.indices.get(index=f"{chunks_prefix(settings)}{generation}-*"):
                es.indices.delete(index=index)
    assert reindex_target(es, settings) is None


def test_one_reindex_runs_at_a_time():
    """A second run would switch to, or discard, the generation the first one builds."""
    from shared.db.repository import run_unlock, try_run_lock
    from shared.reconcile.reindex import _REINDEX_LOCK, ReindexRunning, reindex
    from shared.stores.es_index import reindex_target

    with unit_of_work() as running:
        assert try_run_lock(running.session, _REINDEX_LOCK)  # a reindex under way elsewhere
        try:
            with pytest.raises(ReindexRunning, match="another reindex is under way"):
                reindex(connect(), unit_of_work)
        finally:
            run_unlock(running.session, _REINDEX_LOCK)
    assert reindex_target(get_es(), get_settings()) is None  # it started nothing


def test_a_reindex_whose_copies_are_refused_stops_before_switching_and_resumes(
    client, auth, tenant, worker
):
    """Elasticsearch refuses copies of a page: a copy it keeps refusing (400) stops the reindex
    before its progress passes that page, so it never switches to a generation missing chunks;
    the next run meets only 503s, sends those copies again until they get through, resumes
    and switches.

    The faults are drawn from seeded random numbers, one per copy sent (the permanent 400
    draws none), and the reindex is of this tenant alone, so what a run meets does not depend
    on other tenants' chunks: this tenant's three other copies draw 0.324, 0.151, 0.651 with
    seed 7 (the second is a 503 at a rate of 0.2), and the first copy of the second run draws
    0.012 with seed 31 (a 503 at 0.05)."""
    from elasticsearch import Elasticsearch

    from shared.reconcile.reindex import reindex
    from shared.stores.chunk_index import ElasticsearchChunkIndex, ReindexCopyRefused
    from shared.stores.es_index import reindex_target
    from tests.faults import BulkFaultProxy, BulkFaults

    for i in range(4):
        upload_text(client, auth, f"tern-{i}", f"Arctic tern sighting {i} over the fjord.")
    chunks = wait_converged(tenant)
    poison = sorted(chunks)[0]
    settings = get_settings()

    def reindex_through(faults: BulkFaults):  # type: ignore[no-untyped-def]
        proxy = BulkFaultProxy(settings.es_url(), faults)
        try:
            proxied = ElasticsearchChunkIndex(Elasticsearch(proxy.url, request_timeout=60))
            return reindex(
                replace(connect(), index=proxied), unit_of_work, page_size=1000, tenant_id=tenant
            )
        finally:
            proxy.close()

    refused = BulkFaults({503: 0.2}, seed=7, permanent_400={poison})
    with pytest.raises(ReindexCopyRefused, match="refused"):
        reindex_through(refused)
    assert refused.injected[503] > 0 and refused.injected[400] >= 1
    assert reindex_target(get_es(), settings) is not None  # not switched
    assert es_chunks(tenant) == pg_chunks(tenant)  # the live generation is untouched

    busy = BulkFaults({503: 0.05}, seed=31)
    result = reindex_through(busy)
    assert busy.injected[503] > 0
    assert result.resumed and reindex_target(get_es(), settings) is None
    # Switched to: the copies refused with a 503 were sent again until they got in.
    assert es_chunks(tenant) == pg_chunks(tenant)


def _reindex_while_searching(
    client: TestClient,
    auth: dict[str, str],
    query: str,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`concord reindex` as an operator runs it (with ``env`` added), while lexical searches
    for ``query`` keep going: the command's result, and every search that failed or found
    nothing."""
    failures: list[str] = []
    stop = threading.Event()

    def keep_searching() -> None:
        while not stop.is_set():
            response = client.post(
                "/v1/search", headers=auth, json={"query": query, "mode": "lexical"}
            )
            if response.status_code != 200 or not response.json()["results"]:
                failures.append(f"{response.status_code}: {response.text[:200]}")

    searcher = threading.Thread(target=keep_searching)
    searcher.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "reindex", *(args or [])],
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        stop.set()
        searcher.join()
    return result, failures
