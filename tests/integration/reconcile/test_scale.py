"""Reconcile compares fingerprints over the chunk id and every copied field, works in
bounded ranges at any scale of loss, and repairs a total loss of Elasticsearch."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.reconcile import drift, service
from shared.reconcile.service import reconcile, reconcile_and_verify
from shared.stores.buckets import bucket_of, fingerprint_of_source
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.helpers import (
    es_chunks,
    paused,
    pg_chunks,
    tenant_index,
    upload_text,
    wait_converged,
    wait_job,
)


def _ingest(client: TestClient, auth: dict[str, str], tenant: str, n: int) -> dict[str, int]:
    docs = [
        upload_text(client, auth, f"scale-{i}", f"Note {i} on tides, reefs and lighthouses.")
        for i in range(n)
    ]
    for d in docs:
        wait_job(client, auth, d["job_id"])
    return wait_converged(tenant)


def _copy(tenant: str, chunk_id: str) -> dict[str, Any]:
    return dict(get_es().get(index=tenant_index(tenant), id=chunk_id))


def _write(tenant: str, chunk_id: str, source: dict[str, Any], version: int) -> None:
    get_es().index(
        index=tenant_index(tenant),
        id=chunk_id,
        version=version,
        version_type="external_gte",
        document=source,
        refresh=True,
    )


def _remove(tenant: str, chunk_id: str) -> None:
    get_es().delete(
        index=tenant_index(tenant),
        id=chunk_id,
        version=1,
        version_type="external_gte",
        refresh=True,
    )


def test_a_missing_chunk_and_an_orphan_of_the_same_text_in_one_bucket_do_not_cancel_out(
    client: TestClient, auth, tenant, worker
):
    [chunk] = _ingest(client, auth, tenant, 1)
    copy = _copy(tenant, chunk)
    # An orphan in the same bucket, same version and text: count, version sum and text-hash sum
    # of the bucket are what they were. Its stored fingerprint is honest (its own id's).
    while True:
        ghost = f"{uuid.uuid4()}:0"
        if bucket_of(ghost) == bucket_of(chunk):
            break
    source = {**copy["_source"], "chunk_id": ghost, "document_id": ghost[:36]}
    source["fingerprint"] = fingerprint_of_source(ghost, source)
    _remove(tenant, chunk)
    _write(tenant, ghost, source, version=1)

    found = reconcile(connect(), unit_of_work, tenant)
    assert found.drift["missing"] == {chunk}
    assert found.drift["orphaned"] == {ghost}
    _, after = reconcile_and_verify(connect(), unit_of_work, tenant)
    assert after.total() == 0
    assert es_chunks(tenant) == pg_chunks(tenant)


def test_a_copy_with_a_wrong_copied_field_is_stale_and_repaired(
    client: TestClient, auth, tenant, worker
):
    chunks = _ingest(client, auth, tenant, 2)
    retitled, remeta = sorted(chunks)
    # A copy rewritten with another title, fingerprint recomputed to match: the bucket sums
    # differ from Postgres'.
    copy = _copy(tenant, retitled)
    source = {**copy["_source"], "title": "a title nobody uploaded"}
    source["fingerprint"] = fingerprint_of_source(retitled, source)
    _write(tenant, retitled, source, version=copy["_version"])
    # A copy whose metadata was edited in place, its stored fingerprint left as it was: the
    # sums still agree, so only a deep reconcile (which recomputes every copy's) can see it.
    copy = _copy(tenant, remeta)
    _write(
        tenant, remeta, {**copy["_source"], "metadata": {"edited": "yes"}}, version=copy["_version"]
    )

    found = reconcile(connect(), unit_of_work, tenant)
    assert found.drift["stale"] == {retitled}
    deep = reconcile(connect(), unit_of_work, tenant, deep=True)
    assert deep.drift["stale"] == {retitled, remeta}
    assert deep.buckets_differing == 1  # only the first one shows in the sums

    _, after = reconcile_and_verify(connect(), unit_of_work, tenant, deep=True)
    assert after.total() == 0
    assert reconcile(connect(), unit_of_work, tenant, deep=True).total() == 0
    assert _copy(tenant, retitled)["_source"]["title"] == ""
    assert _copy(tenant, remeta)["_source"]["metadata"] == {}


def test_losing_all_of_elasticsearch_is_repaired_range_by_range(
    client: TestClient, auth, tenant, worker, monkeypatch: pytest.MonkeyPatch
):
    chunks = _ingest(client, auth, tenant, 12)
    for chunk in chunks:
        _remove(tenant, chunk)
    assert es_chunks(tenant) == {}
    # Ranges of at most 3 chunks: the 12 differing buckets need at least 4 transactions.
    monkeypatch.setattr(service, "RANGE_CHUNKS", 3)
    monkeypatch.setattr(drift, "ID_PAGE", 5)
    seen: list[tuple[int, int]] = []

    with paused(worker):  # only the repair queues writes; nothing else relays meanwhile
        found, after = reconcile_and_verify(
            connect(),
            unit_of_work,
            tenant,
            progress=lambda t, done, total: seen.append((done, total)),
        )
    assert found.drift["missing"] == set(chunks)
    assert found.repairs_queued == len(chunks)
    # Two of the 12 chunk ids may share one of the 1,024 buckets: count buckets, not chunks.
    buckets = found.buckets_differing
    assert len(seen) >= 4 and seen[-1] == (buckets, buckets)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert after.total() == 0
    assert es_chunks(tenant) == pg_chunks(tenant)


def test_a_repair_already_waiting_in_the_outbox_is_not_queued_twice(
    client: TestClient, auth, tenant, worker
):
    [chunk] = _ingest(client, auth, tenant, 1)
    _remove(tenant, chunk)
    with paused(worker):
        first = reconcile(connect(), unit_of_work, tenant, repair=True)
        second = reconcile(connect(), unit_of_work, tenant, repair=True)
    assert first.repairs_queued == 1
    # The first repair is still waiting in the outbox: a write in flight, not drift.
    assert second.repairs_queued == 0 and second.in_flight == {chunk} and second.total() == 0
    _, after = reconcile_and_verify(connect(), unit_of_work, tenant)
    assert after.total() == 0


def test_a_dead_lettered_write_is_not_repaired_again_until_an_operator_acts(
    client: TestClient, auth, tenant, worker
):
    """A copy Elasticsearch refused for good (its write is a dead letter) would fail again on
    every repairing reconcile: it is held and reported until the dead letter is replayed or
    discarded."""
    from sqlalchemy import delete

    from shared.db import unit_of_work
    from shared.models import DeadLetter
    from tests.helpers import outbox_dead_letter

    [chunk] = _ingest(client, auth, tenant, 1)
    _remove(tenant, chunk)
    outbox_dead_letter(
        tenant,
        chunk,
        "es_400",
        "mapper_parsing_exception: as if the copy could not be indexed",
        1,
        {"op": "index", "version": 1},
    )
    with paused(worker):
        held = reconcile(connect(), unit_of_work, tenant, repair=True)
    assert held.repairs_queued == 0 and held.repairs_held == {chunk}
    assert held.as_dict()["repairs_held_by_dead_letters"] == [chunk]
    with unit_of_work() as uow:  # the operator discards it (concord dlq discard)
        uow.session.execute(delete(DeadLetter).where(DeadLetter.ref == chunk))
    repaired, after = reconcile_and_verify(connect(), unit_of_work, tenant)
    assert repaired.repairs_queued == 1 and after.total() == 0


def test_a_chunk_is_copied_with_its_own_versions_title_while_a_newer_version_waits(
    client: TestClient, auth, tenant, worker
):
    """Version 1's chunk is repaired while version 2 (another title and metadata) is accepted
    but not yet processed: the copy must carry version 1's title and metadata, as its
    fingerprint does, or reconcile would call it stale on every run."""
    first = upload_text(client, auth, "retitled.txt", "Kelp forests.", title="Old title")
    wait_job(client, auth, first["job_id"])
    [chunk] = wait_converged(tenant)
    _remove(tenant, chunk)
    with paused(worker):
        upload_text(
            client,
            auth,
            "retitled.txt",
            "Kelp forests, revised.",
            title="New title",
            metadata={"rev": 2},
        )
        _, after = reconcile_and_verify(connect(), unit_of_work, tenant)
        assert after.total() == 0, after.as_dict()
        copy = _copy(tenant, chunk)["_source"]
        assert (copy["title"], copy["metadata"], copy["version"]) == ("Old title", {}, 1)
    wait_converged(tenant)
    assert _copy(tenant, chunk)["_source"]["title"] == "New title"
