"""Issue 5: reconciliation finds each class of drift exactly, repairs it, and a second run
finds nothing; dead letters can be replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from shared.db import unit_of_work
from shared.ingest import pipeline
from shared.models import DeadLetter, EsOutbox
from shared.outbox import service as relay
from shared.reconcile.service import drain_repairs, reconcile, reconcile_and_verify
from shared.settings import get_settings
from shared.stores.elastic import get_es
from tests.conftest import wait_for
from tests.helpers import (
    dead_lettered_upload,
    es_chunks,
    index_orphan,
    key_headers,
    paused,
    pg_chunks,
    search,
    tenant_index,
    upload_text,
    wait_converged,
    wait_job,
)


def drop_outbox(document_id: str) -> None:
    """As if the relay had lost these writes."""
    with unit_of_work() as uow:
        uow.session.execute(delete(EsOutbox).where(EsOutbox.document_id == uuid.UUID(document_id)))


def test_each_class_of_drift_is_found_exactly_and_repaired(
    client: TestClient, auth, tenant, worker
):
    docs = [
        upload_text(client, auth, f"doc-{i}", f"Note {i} about lighthouses and tides.")
        for i in range(5)
    ]
    for d in docs:
        wait_job(client, auth, d["job_id"])
    chunks = wait_converged(tenant)
    assert reconcile(unit_of_work, tenant).total() == 0
    es, alias = get_es(), tenant_index(tenant)
    chunk_of = {d["document_id"]: f"{d['document_id']}:0" for d in docs}
    assert set(chunk_of.values()) == set(chunks)

    # missing: the copy of doc 0 vanished from Elasticsearch (as if a shard lost it; a delete
    # at its own version leaves no newer tombstone behind).
    es.delete(
        index=alias,
        id=chunk_of[docs[0]["document_id"]],
        version=1,
        version_type="external_gte",
        refresh=True,
    )
    # orphaned: a copy of a chunk Postgres never had.
    ghost = index_orphan(tenant)
    # wrong tenant: doc 2's copy claims another tenant (same version).
    copy = es.get(index=alias, id=chunk_of[docs[2]["document_id"]])
    es.index(
        index=alias,
        id=copy["_id"],
        version=copy["_version"],
        version_type="external_gte",
        document={**copy["_source"], "tenant_id": "someone-else"},
        refresh=True,
    )
    # stale and tombstoned: doc 1 updated and doc 3 deleted, but their writes never reached ES.
    with paused(worker):
        v2 = upload_text(client, auth, "doc-1", "Note 1, revised: lighthouses are automated.")
        pipeline.process_job(unit_of_work, uuid.UUID(v2["job_id"]))
        drop_outbox(v2["document_id"])
        assert (
            client.delete(f"/v1/documents/{docs[3]['document_id']}", headers=auth).status_code
            == 200
        )
        drop_outbox(docs[3]["document_id"])

    found = reconcile(unit_of_work, tenant)
    counts = found.as_dict()["counts"]
    assert counts == {"missing": 1, "stale": 1, "orphaned": 2, "wrong_tenant": 1}
    assert found.drift["missing"] == {chunk_of[docs[0]["document_id"]]}
    assert found.drift["stale"] == {chunk_of[docs[1]["document_id"]]}
    assert found.drift["orphaned"] == {ghost, chunk_of[docs[3]["document_id"]]}
    assert found.drift["wrong_tenant"] == {chunk_of[docs[2]["document_id"]]}
    assert found.buckets_differing <= 5 and found.ids_read <= 10  # only the drifted buckets

    repaired, after = reconcile_and_verify(unit_of_work, tenant)
    assert repaired.repairs_queued == 5
    assert after.total() == 0
    assert es_chunks(tenant) == pg_chunks(tenant)
    assert reconcile(unit_of_work, tenant).total() == 0
    assert (
        es.search(
            index=get_settings().es_chunks_alias(), query={"term": {"tenant_id": "someone-else"}}
        )["hits"]["total"]["value"]
        == 0
    )


def test_repair_waits_for_repairs_that_another_relay_claimed_first(
    client: TestClient, auth, tenant, worker
):
    """A running relay may claim the queued repairs before the operator's drain does; the
    check after the repair must wait for that relay instead of reporting its drift as left."""
    up = upload_text(client, auth, "claimed.txt", "Repairs claimed by another relay.")
    wait_job(client, auth, up["job_id"])
    [chunk] = wait_converged(tenant)
    es = get_es()
    es.delete(
        index=tenant_index(tenant),
        id=chunk,
        version=1,
        version_type="external_gte",
        refresh=True,
    )
    claimed = threading.Event()

    class SlowElasticsearch:
        """The other relay: it holds the claimed rows for a second before it sends them."""

        def __getattr__(self, name: str) -> Any:
            return getattr(es, name)

        def bulk(self, **kwargs: Any) -> Any:
            claimed.set()
            time.sleep(1.5)
            return es.bulk(**kwargs)

    with paused(worker):
        assert reconcile(unit_of_work, tenant, repair=True).repairs_queued == 1
        other_relay = threading.Thread(
            target=relay.drain, args=(unit_of_work,), kwargs={"es": SlowElasticsearch()}
        )
        other_relay.start()
        try:
            assert claimed.wait(timeout=30)
            drain_repairs(unit_of_work, {chunk})
            assert reconcile(unit_of_work, tenant).total() == 0
        finally:
            other_relay.join(timeout=60)


def test_reconcile_cli_reports_and_exits_nonzero_while_drift_remains(client, auth, tenant, worker):
    up = upload_text(client, auth, "cli.txt", "Reconcile me from the command line.")
    wait_job(client, auth, up["job_id"])
    [chunk] = wait_converged(tenant)
    get_es().delete(
        index=tenant_index(tenant),
        id=chunk,
        version=1,
        version_type="external_gte",
        refresh=True,
    )

    def concord(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    dry = concord("reconcile", "--tenant", tenant, "--json")
    assert dry.returncode == 1, dry.stderr
    assert json.loads(dry.stdout)["counts"]["missing"] == 1
    fixed = concord("reconcile", "--tenant", tenant, "--repair", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["after_repair"]["total_drift"] == 0
    stats = concord("stats", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["last_reconcile"]["total_drift"] == 0


def test_dlq_replay_reruns_a_dead_lettered_job(client, auth, tenant, worker):
    job_id, letter_id = dead_lettered_upload(client, auth, worker)
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "dlq", "replay", str(letter_id)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = wait_job(client, auth, job_id)
    assert job["attempts"] == 1
    wait_converged(tenant)
    with unit_of_work() as uow:
        assert uow.session.get(DeadLetter, letter_id) is None


def _reindex_while_searching(
    client: TestClient, auth: dict[str, str], query: str, env: dict[str, str] | None = None
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
            [sys.executable, "-m", "services.cli.main", "reindex"],
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


def test_reindex_changes_the_shard_count_online_and_bm25_scores_stay_the_same(
    client, auth, tenant, worker
):
    """An operator sets CONCORD_ES_SHARDS=2 and runs `concord reindex`: the tenant's index
    comes back with two shards while searches keep answering, and lexical scores stay those
    of one shard (statistics pooled over both). Put back to one shard for the tests after."""
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
    result, failures = _reindex_while_searching(client, auth, "sextant", {"CONCORD_ES_SHARDS": "2"})
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
        reindex(unit_of_work)  # this process's settings: one shard, as the other tests expect
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
        reindex(unit_of_work, crash_after_first_page, page_size=3)
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
    result = reindex(unit_of_work, page_size=1000)
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
                reindex(unit_of_work)
        finally:
            run_unlock(running.session, _REINDEX_LOCK)
    assert reindex_target(get_es(), get_settings()) is None  # it started nothing


def test_a_periodic_reconcile_still_running_is_not_joined_by_the_next():
    """Beat's reconcile runs on the ingest workers without the task time limit: one that
    outlasts the interval makes the next skip, rather than run beside it."""
    from shared.db.repository import run_unlock, try_run_lock
    from shared.reconcile.service import _PERIODIC_LOCK, periodic_reconcile

    with unit_of_work() as running:
        assert try_run_lock(running.session, _PERIODIC_LOCK)  # a run under way elsewhere
        try:
            assert periodic_reconcile(unit_of_work) == {
                "skipped": "the previous periodic reconcile is still running"
            }
        finally:
            run_unlock(running.session, _PERIODIC_LOCK)
    ran = periodic_reconcile(unit_of_work)
    assert "skipped" not in ran and ran["tenants"] >= 1


def test_admin_endpoints_need_the_admin_scope(client, auth, tenant):
    admin = key_headers(tenant, ["admin"])
    assert client.get("/v1/admin/stats", headers=auth).status_code == 403
    assert client.get("/v1/admin/stats").status_code == 401
    stats = client.get("/v1/admin/stats", headers=admin)
    assert stats.status_code == 200 and "outbox_backlog" in stats.json()
    report = client.post("/v1/admin/reconcile", headers=admin, json={})
    assert report.status_code == 200 and report.json()["total_drift"] == 0
    assert client.get("/v1/admin/jobs", headers=admin, params={"stuck": True}).status_code == 200
    assert client.get("/v1/admin/dead-letters/999999", headers=admin).status_code == 404
    # admin implies read and write on its own tenant
    assert client.post("/v1/search", headers=admin, json={"query": "x"}).status_code == 200


def test_a_reindex_whose_copies_are_refused_stops_before_switching_and_resumes(
    client, auth, tenant, worker
):
    """Elasticsearch refuses copies of a page: a copy it keeps refusing (400) stops the reindex
    before its progress passes that page, so it never switches to a generation missing chunks;
    the next run meets only 503s, sends those copies again until they get through, resumes
    and switches.

    The faults are drawn from seeded random numbers, one per copy sent (the permanent 400
    draws none), so what a run meets does not depend on how many other tenants' chunks the
    database holds: run alone, this tenant's three other copies draw 0.324, 0.151, 0.651 with
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
            return reindex(unit_of_work, page_size=1000, index=proxied)
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


def test_replaying_a_repair_letter_overwrites_the_equal_version(client, auth, tenant, worker):
    """A repair (from reconcile) may overwrite a copy at its own version, as a copy edited
    outside Concord is; replayed from its dead letter it must still be a repair, not an
    index at that version, which Elasticsearch answers 409 and the relay counts as done."""
    from shared.admin.service import replay_dead_letter
    from tests.helpers import outbox_dead_letter

    up = upload_text(client, auth, "petrel", "Storm petrels patter on the waves.")
    wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    es, alias, chunk = get_es(), tenant_index(tenant), f"{up['document_id']}:0"
    copy = es.get(index=alias, id=chunk)
    es.index(  # edited outside Concord, at the same version
        index=alias,
        id=chunk,
        version=copy["_version"],
        version_type="external_gte",
        document={**copy["_source"], "text": "edited outside"},
        refresh=True,
    )
    letter_id = outbox_dead_letter(
        tenant,
        chunk,
        "es_503",
        "unavailable",
        5,
        {"op": "repair", "version": up["version"], "document_id": up["document_id"]},
    )
    with unit_of_work() as uow:
        replay_dead_letter(uow, letter_id, tenant)

    def repaired() -> bool:
        relay.drain(unit_of_work)
        es.indices.refresh(index=alias)
        return es.get(index=alias, id=chunk)["_source"]["text"] != "edited outside"

    wait_for(repaired, 30, what="the replayed repair to overwrite the edited copy")
