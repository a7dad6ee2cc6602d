"""Reconciliation finds each class of drift exactly, repairs it, and a second run
finds nothing; dead letters can be replayed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import delete

from shared.db import unit_of_work
from shared.ingest import pipeline
from shared.models import EsOutbox
from shared.reconcile.service import drain_repairs, reconcile, reconcile_and_verify
from shared.relay import service as relay
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.helpers import (
    es_chunks,
    index_orphan,
    paused,
    pg_chunks,
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
    assert reconcile(connect(), unit_of_work, tenant).total() == 0
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
        pipeline.process_job(connect(), unit_of_work, uuid.UUID(v2["job_id"]))
        drop_outbox(v2["document_id"])
        assert (
            client.delete(f"/v1/documents/{docs[3]['document_id']}", headers=auth).status_code
            == 200
        )
        drop_outbox(docs[3]["document_id"])

    found = reconcile(connect(), unit_of_work, tenant)
    counts = found.as_dict()["counts"]
    assert counts == {"missing": 1, "stale": 1, "orphaned": 2, "wrong_tenant": 1}
    assert found.drift["missing"] == {chunk_of[docs[0]["document_id"]]}
    assert found.drift["stale"] == {chunk_of[docs[1]["document_id"]]}
    assert found.drift["orphaned"] == {ghost, chunk_of[docs[3]["document_id"]]}
    assert found.drift["wrong_tenant"] == {chunk_of[docs[2]["document_id"]]}
    assert found.buckets_differing <= 5 and found.ids_read <= 10  # only the drifted buckets

    repaired, after = reconcile_and_verify(connect(), unit_of_work, tenant)
    assert repaired.repairs_queued == 5
    assert after.total() == 0
    assert es_chunks(tenant) == pg_chunks(tenant)
    assert reconcile(connect(), unit_of_work, tenant).total() == 0
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
        assert reconcile(connect(), unit_of_work, tenant, repair=True).repairs_queued == 1
        other_relay = threading.Thread(
            target=relay.drain,
            args=(
                replace(connect(), index=ElasticsearchChunkIndex(SlowElasticsearch())),
                unit_of_work,
            ),  # type: ignore[arg-type]
        )
        other_relay.start()
        try:
            assert claimed.wait(timeout=30)
            drain_repairs(connect(), unit_of_work, {chunk})
            assert reconcile(connect(), unit_of_work, tenant).total() == 0
        finally:
            other_relay.join(timeout=60)


def test_reconcile_cli_reports_and_exits_nonzero_while_drift_remains(client, auth, tenant, worker):
    """Drift makes the command exit 1 until repaired; writes still waiting in the outbox (an
    indexed job the relay has not sent yet) are reported in flight, not as drift."""
    from shared.documents.schemas import Upload
    from shared.documents.service import accept_upload

    up = upload_text(client, auth, "cli.txt", "Reconcile me from the command line.")
    wait_job(client, auth, up["job_id"])
    [chunk] = wait_converged(tenant)

    def concord(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    with paused(worker):  # indexed in Postgres, its writes not relayed yet
        with unit_of_work() as uow:
            pending = accept_upload(
                uow,
                get_settings(),
                Upload(
                    tenant_id=tenant,
                    external_id="pending.txt",
                    raw=b"Two sentences wait in the outbox. The relay has not sent them.",
                    content_type="text/plain",
                ),
                queue=None,
            )
        assert pending.job_id is not None
        pipeline.process_job(connect(), unit_of_work, pending.job_id)
        in_flight = concord("reconcile", "--tenant", tenant, "--json")
    assert in_flight.returncode == 0, in_flight.stdout + in_flight.stderr
    report = json.loads(in_flight.stdout)
    assert report["total_drift"] == 0 and report["in_flight"] >= 1, report
    assert all(cid.startswith(str(pending.document_id)) for cid in report["in_flight_samples"])
    wait_converged(tenant)

    get_es().delete(
        index=tenant_index(tenant),
        id=chunk,
        version=1,
        version_type="external_gte",
        refresh=True,
    )
    dry = concord("reconcile", "--tenant", tenant, "--json")
    assert dry.returncode == 1, dry.stderr
    assert json.loads(dry.stdout)["counts"]["missing"] == 1
    fixed = concord("reconcile", "--tenant", tenant, "--repair", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["after_repair"]["total_drift"] == 0
    stats = concord("stats", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["last_reconcile"]["total_drift"] == 0


def test_a_periodic_reconcile_still_running_is_not_joined_by_the_next():
    """Beat's reconcile runs on the ingest workers without the task time limit: one that
    outlasts the interval makes the next skip, rather than run beside it."""
    from shared.db.repository import run_unlock, try_run_lock
    from shared.reconcile.service import _PERIODIC_LOCK, periodic_reconcile

    with unit_of_work() as running:
        assert try_run_lock(running.session, _PERIODIC_LOCK)  # a run under way elsewhere
        try:
            assert periodic_reconcile(connect(), unit_of_work) == {
                "skipped": "the previous periodic reconcile is still running"
            }
        finally:
            run_unlock(running.session, _PERIODIC_LOCK)
    ran = periodic_reconcile(connect(), unit_of_work)
    assert "skipped" not in ran and ran["tenants"] >= 1


def test_repair_waits_for_repairs_elasticsearch_holds_back_and_then_exits_0(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any, capsys: Any
) -> None:
    """Before, with two chunks deleted from Elasticsearch behind Concord's back, `concord
    reconcile --repair` printed "queued 2 repairs; drift after repair: 2" and exited 1: the
    delete left a tombstone of a newer version, which blocks the repair until Elasticsearch
    forgets it (index.gc_deletes, 60 s), and the repairs landed later. It now waits for them
    (here the index forgets tombstones after 10 s, to keep the test short: at 2 s, a loaded
    machine let them go before the first command ran, and `--no-wait` found nothing held)."""
    from services.cli.errors import run
    from services.cli.main import app

    jobs = [upload_text(client, auth, f"r{i}.txt", f"Reconcile note {i} about tides.")["job_id"]
            for i in range(2)]  # fmt: skip
    for job in jobs:
        wait_job(client, auth, job)
    chunks = wait_converged(tenant)
    es = get_es()
    alias = get_settings().es_chunks_alias()
    es.indices.refresh(index=alias)
    hits = es.search(index=alias, query={"term": {"tenant_id": tenant}}, size=10)["hits"]["hits"]
    assert {h["_id"] for h in hits} == set(chunks)
    for hit in hits:  # out of band: a delete without Concord's version
        es.delete(index=hit["_index"], id=hit["_id"], refresh=True)
    es.indices.put_settings(index=hits[0]["_index"], settings={"index.gc_deletes": "10s"})
    try:
        with paused(worker):  # this command's own drains send the repairs
            assert run(app, ["reconcile", "--tenant", tenant, "--repair", "--no-wait"]) == 1
            assert "drift after repair: 2" in capsys.readouterr().out
            assert run(app, ["reconcile", "--tenant", tenant, "--repair", "--timeout", "60"]) == 0
    finally:
        es.indices.put_settings(index=hits[0]["_index"], settings={"index.gc_deletes": "60s"})
    out = capsys.readouterr().out
    assert "drift after repair: 0" in out
    assert reconcile(connect(), unit_of_work, tenant).total() == 0
