"""What each real store answers to each failure class, in Concord's terms (the classification
itself, and StoreUnavailable from every method of every adapter when its store does not
answer, are unit tests: tests/unit/stores/test_store_errors.py).

* rejected: a request the store refuses for what it is (StoreRejected, not retried), and the
  caller's other work is unharmed;
* conflict: a write that lost to another (StoreConflict, retried: the retry goes through);
  the chunk index answers its versioned writes' conflicts per item (409), in memory as in
  Elasticsearch, and raises for none of them."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from redis import Redis

from shared.db import unit_of_work
from shared.errors import StoreConflict, StoreError, StoreRejected
from shared.retry import is_retriable
from shared.settings import get_settings
from shared.stores.compose import connect
from shared.stores.memory import MemoryChunkIndex
from shared.stores.schemas import VersionChunks
from shared.stores.snapshots import PREFIX
from shared.stores.vector_store import PgVectorStore
from tests.contract.test_stores import (
    ElasticsearchHarness,
    PgVectorHarness,
    Record,
    _doc,
    _tenant,
)

pytestmark = pytest.mark.usefixtures("fresh_stores")


def _version(record: Record, version: int, embedding: np.ndarray | None = None) -> VersionChunks:
    written = PgVectorHarness._version(record.at_version(version))
    if embedding is None:
        return written
    return replace(written, rows=[replace(written.rows[0], embedding=embedding)])


# ------------------------------------------------------------------ Postgres


def test_a_vector_of_the_wrong_size_is_rejected_and_its_transaction_writes_nothing() -> None:
    ours, theirs = Record(_tenant(), _doc(), "Ours."), Record(_tenant(), _doc(), "Theirs.")
    harness = PgVectorHarness()
    harness.write([ours, theirs])
    with pytest.raises(StoreRejected) as raised, unit_of_work() as uow:
        store = PgVectorStore(uow.session)
        store.upsert([_version(theirs, 2)])
        store.upsert([_version(ours, 2, np.zeros(3, dtype=np.float32))])
    assert "dimensions" in raised.value.message and not is_retriable(raised.value)
    assert "Ours." not in raised.value.message  # the server's words, not the statement's rows
    with unit_of_work() as uow:  # the refused transaction wrote nothing, the next one does
        store = PgVectorStore(uow.session)
        assert store.fingerprints_by_ids(theirs.tenant_id, [theirs.id])[theirs.id][0] == 1
        store.upsert([_version(theirs, 2)])
    with unit_of_work() as uow:
        assert PgVectorStore(uow.session).fingerprints_by_ids(theirs.tenant_id, [theirs.id])[
            theirs.id
        ][0] == 2  # fmt: skip


def test_two_writes_that_deadlock_one_is_a_conflict_and_its_retry_goes_through() -> None:
    """Two batches writing the same documents' chunks in opposite orders: Postgres breaks the
    deadlock by failing one (after deadlock_timeout, 1 s), which the adapter calls a conflict
    and the ingest's retry rule retries."""
    tenant = _tenant()
    a, b = Record(tenant, _doc(), "First."), Record(tenant, _doc(), "Second.")
    PgVectorHarness().write([a, b])
    both_hold_their_first = threading.Barrier(2, timeout=30)
    failures: list[StoreError] = []

    def write(first: Record, second: Record) -> None:
        try:
            with unit_of_work() as uow:
                store = PgVectorStore(uow.session)
                store.upsert([_version(first, 2)])
                both_hold_their_first.wait()
                store.upsert([_version(second, 2)])
        except StoreError as e:
            failures.append(e)

    threads = [threading.Thread(target=write, args=pair) for pair in ((a, b), (b, a))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    [conflict] = failures
    assert type(conflict) is StoreConflict and "40P01" in conflict.message
    assert is_retriable(conflict)
    with unit_of_work() as uow:  # the winner's writes stand; the loser retries
        PgVectorStore(uow.session).upsert([_version(a, 2), _version(b, 2)])
    with unit_of_work() as uow:
        written = PgVectorStore(uow.session).fingerprints_by_ids(tenant, [a.id, b.id])
    assert {cid: version for cid, (version, _) in written.items()} == {a.id: 2, b.id: 2}


# ------------------------------------------------------------------ Elasticsearch


def test_a_malformed_bulk_request_is_rejected_whole_and_not_retried() -> None:
    harness, tenant = ElasticsearchHarness(), _tenant()
    harness.write([Record(tenant, _doc(), "Already indexed.")])
    with pytest.raises(StoreRejected) as raised:
        harness.index.bulk([(tenant, [{"no_such_action": {"_id": "x"}}, {"text": "x"}])])
    assert raised.value.status == 400 and not is_retriable(raised.value)
    assert harness.count_of_tenant(tenant) == 1


@pytest.mark.parametrize("kind", ["elasticsearch", "memory"])
def test_a_write_that_lost_to_a_newer_version_is_a_409_for_that_item_alone(kind: str) -> None:
    index: Any = ElasticsearchHarness().index if kind == "elasticsearch" else MemoryChunkIndex()
    tenant = _tenant()
    newer, other = Record(tenant, _doc(), "Newer.", version=3), Record(tenant, _doc(), "Other.")
    index.prepare([tenant])
    assert index.write([ElasticsearchHarness._copy(newer)], "external") == [201]
    late = [ElasticsearchHarness._copy(newer.at_version(2)), ElasticsearchHarness._copy(other)]
    assert index.write(late, "external") == [409, 201]


# ------------------------------------------------------------------ Redis


def test_a_snapshot_redis_refuses_is_rejected_and_another_tenants_are_kept() -> None:
    snapshots = connect(get_settings()).snapshots
    tenant, other = _tenant(), _tenant()
    snapshots.put(other, "o" * 22, b"theirs")
    settings = get_settings()
    Redis(host=settings.redis_host, port=settings.redis_port, db=settings.redis_db).set(
        f"{PREFIX}tenant:{tenant}", "not the sorted set the cap keeps"
    )  # what only a bug or an operator's hand could put there
    with pytest.raises(StoreRejected) as raised:
        snapshots.put(tenant, "t" * 22, b"mine")
    assert raised.value.store == "Redis" and not is_retriable(raised.value)
    assert snapshots.get("o" * 22) == b"theirs"
