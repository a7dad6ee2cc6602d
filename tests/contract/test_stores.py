"""One contract, both chunk stores (the way Haystack's document stores all pass one shared test
class): ``ChunkStoreContract`` holds what every store Concord writes chunks to must do, and
each store's test class gives it the real store through a small harness. A second
implementation (another search engine, another vector database) adds a harness and a
subclass, and passes the same tests.

What the contract asks of a store:
* it keeps the newest version of a chunk: a write of an older version never replaces it;
* per-bucket sums and per-chunk fingerprints are exactly those of what was written (this is
  what reconciliation compares across the stores);
* it lists its tenants and counts a tenant's chunks;
* a search within one tenant never returns another tenant's chunk, even an identical one,
  ranks the chunk a query was made from first, and honours ``size``;
* a metadata filter (equality, IN, a numeric range) means the same in every store;
* a delete at a version removes the chunk.

The tests write chunks straight into each store (no queue, no pipeline), each in fresh
tenants, so they are the store's own behaviour and nothing else's.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from shared.db import unit_of_work
from shared.db.repository import limit_statements, now
from shared.documents import repository as documents_repo
from shared.errors import StoreUnavailable
from shared.models import Chunk, Document
from shared.stores import partitions, ports, vector_store
from shared.stores import repository as stores_repo
from shared.stores.buckets import bucket_of, fingerprint
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.filters import Filters
from shared.stores.schemas import BucketStats, ChunkRow, Fingerprints, VersionChunks, chunk_id
from shared.stores.vector_store import PgVectorStore
from shared.tenants import repository as tenants_repo
from tests.contract.port_calls import ALL, Claims, methods
from tests.helpers import key_headers, upload_text, wait_converged, wait_job

DIMENSIONS = 384


def _vector(text: str) -> np.ndarray:
    """A unit vector of its own for each text: a search made from a chunk's vector finds that
    chunk first, as a search made from its text finds it first by BM25."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


@dataclass
class Record:
    """One chunk as a test writes it into a store."""

    tenant_id: str
    document_id: uuid.UUID
    text: str
    version: int = 1
    ordinal: int = 0
    title: str = ""
    section: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return chunk_id(self.document_id, self.ordinal)

    @property
    def external_id(self) -> str:
        return f"ext-{self.document_id}"

    @property
    def text_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def fingerprint(self) -> int:
        return fingerprint(
            chunk_id=self.id,
            tenant_id=self.tenant_id,
            document_id=str(self.document_id),
            external_id=self.external_id,
            version=self.version,
            ordinal=self.ordinal,
            text_hash=self.text_hash,
            title=self.title,
            section=self.section,
            metadata=self.metadata,
        )

    def at_version(self, version: int, text: str | None = None) -> Record:
        return Record(
            self.tenant_id, self.document_id, text or self.text, version, self.ordinal,
            self.title, self.section, self.metadata,
        )  # fmt: skip


def expected_buckets(records: list[Record]) -> BucketStats:
    stats: dict[int, tuple[int, int, int]] = {}
    for r in records:
        n, v, h = stats.get(bucket_of(r.id), (0, 0, 0))
        stats[bucket_of(r.id)] = (n + 1, v + r.version, h + r.fingerprint)
    return stats


class StoreUnderTest(Protocol):
    """The glue between the contract and one store: writes and deletes the way that store is
    written to, reads through the store's own adapter."""

    def write(self, records: list[Record]) -> None: ...
    def delete(self, record: Record, version: int) -> None: ...
    def search(
        self, tenant_id: str, like: Record, size: int, filters: Filters | None = None
    ) -> list[str]: ...
    def bucket_stats(self, tenant_id: str) -> BucketStats: ...
    def fingerprints(self, tenant_id: str) -> Fingerprints: ...
    def tenants(self) -> set[str]: ...
    def count_of_tenant(self, tenant_id: str) -> int: ...


def _ids(records: list[Record]) -> set[str]:
    return {r.id for r in records}


def _tenant() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def _doc() -> uuid.UUID:
    return uuid.uuid4()


class ChunkStoreContract:
    """The tests every chunk store passes; a subclass provides the ``store`` fixture."""

    PORTS: ClassVar[Claims] = {ports.ChunkAudit: ALL}

    def test_bucket_sums_and_fingerprints_are_those_of_what_was_written(
        self, store: StoreUnderTest
    ) -> None:
        tenant = _tenant()
        records = [
            Record(tenant, _doc(), f"Note {i} on tidal flats.", title="Notes", section=f"s{i}")
            for i in range(5)
        ]
        records.append(Record(tenant, _doc(), "Metadata counts too.", metadata={"team": "a"}))
        store.write(records)
        assert store.fingerprints(tenant) == {r.id: (r.version, r.fingerprint) for r in records}
        assert store.bucket_stats(tenant) == expected_buckets(records)
        assert store.bucket_stats(_tenant()) == {}

    def test_an_older_version_never_replaces_a_newer_one(self, store: StoreUnderTest) -> None:
        tenant = _tenant()
        first = Record(tenant, _doc(), "Version one of the heron survey.")
        newer = first.at_version(3, "Version three of the heron survey.")
        store.write([first])
        store.write([newer])
        store.write([first.at_version(2, "A late version two.")])  # late, out of order
        assert store.fingerprints(tenant) == {newer.id: (3, newer.fingerprint)}

    def test_tenants_and_counts(self, store: StoreUnderTest) -> None:
        tenant, other = _tenant(), _tenant()
        store.write([Record(tenant, _doc(), f"Tenant note {i}.") for i in range(3)])
        store.write([Record(other, _doc(), "The other tenant's note.")])
        assert {tenant, other} <= store.tenants()
        assert (store.count_of_tenant(tenant), store.count_of_tenant(other)) == (3, 1)

    def test_search_stays_within_the_tenant_and_ranks_its_source_first(
        self, store: StoreUnderTest
    ) -> None:
        tenant, other = _tenant(), _tenant()
        texts = ["Kelp forests shelter otters.", "Glaciers carve fjords.", "Bees dance."]
        mine = [Record(tenant, _doc(), text) for text in texts]
        # The other tenant holds the very same texts: a filter that leaked would show them.
        theirs = [Record(other, _doc(), text) for text in texts]
        store.write(mine + theirs)
        for record in mine:
            found = store.search(tenant, record, size=10)
            assert found[0] == record.id
            assert set(found) <= _ids(mine)
        assert len(store.search(tenant, mine[0], size=1)) == 1
        assert set(store.search(other, mine[0], size=10)) <= _ids(theirs)

    def test_a_metadata_filter_means_the_same_in_every_store(self, store: StoreUnderTest) -> None:
        tenant = _tenant()
        a = Record(tenant, _doc(), "Harbour seals haul out.", metadata={"team": "a", "year": 2020})
        b = Record(tenant, _doc(), "Harbour seals dive.", metadata={"team": "b", "year": 2024})
        c = Record(tenant, _doc(), "Harbour seals moult.", metadata={"team": "c"})
        store.write([a, b, c])

        def found(filters: dict[str, Any]) -> set[str]:
            return set(store.search(tenant, a, 10, Filters.model_validate({"metadata": filters})))

        assert found({"team": "a"}) == {a.id}
        assert found({"team": ["a", "b"]}) == {a.id, b.id}
        assert found({"year": {"gte": 2022}}) == {b.id}
        assert found({"year": {"lt": 2030}}) == {a.id, b.id}  # c has no year: never in range

    def test_a_delete_at_a_version_removes_the_chunk(self, store: StoreUnderTest) -> None:
        tenant = _tenant()
        gone, kept = Record(tenant, _doc(), "Soon gone."), Record(tenant, _doc(), "Staying.")
        store.write([gone, kept])
        store.delete(gone, version=2)
        assert set(store.fingerprints(tenant)) == {kept.id}
        assert store.count_of_tenant(tenant) == 1
        assert gone.id not in store.search(tenant, gone, size=10)


# ------------------------------------------------------------------ pgvector


class PgVectorHarness:
    """Writes through PgVectorStore in committed transactions, as the pipeline does (with
    the document rows the chunks belong to); reads through it too."""

    def write(self, records: list[Record]) -> None:
        with unit_of_work() as uow:
            tenants_repo.ensure_tenants(uow.session, [r.tenant_id for r in records])
            known = documents_repo.documents_by_ids(uow.session, [r.document_id for r in records])
            for r in records:
                if r.document_id in known:
                    known[r.document_id].version = max(known[r.document_id].version, r.version)
                    continue
                known[r.document_id] = Document(
                    id=r.document_id,
                    tenant_id=r.tenant_id,
                    external_id=r.external_id,
                    title=r.title,
                    metadata_=r.metadata,
                    version=r.version,
                    content_hash="contract",
                    deleted=False,
                )
                documents_repo.add_document(uow.session, known[r.document_id])
            uow.session.flush()
            PgVectorStore(uow.session).upsert([self._version(r) for r in records])

    @staticmethod
    def _version(r: Record) -> VersionChunks:
        row = ChunkRow(
            id=r.id,
            ordinal=r.ordinal,
            text=r.text,
            text_hash=r.text_hash,
            char_start=0,
            char_end=len(r.text),
            section=r.section,
            token_count=len(r.text.split()),
            embedding=_vector(r.text),
        )
        return VersionChunks(
            r.tenant_id, r.document_id, r.version, r.external_id, r.title, r.metadata, [row]
        )

    def delete(self, record: Record, version: int) -> None:
        with unit_of_work() as uow:
            PgVectorStore(uow.session).delete_superseded({record.document_id: version})

    def search(
        self, tenant_id: str, like: Record, size: int, filters: Filters | None = None
    ) -> list[str]:
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            hits = store.nearest(tenant_id, _vector(like.text).tolist(), size, filters)
        return [cid for cid, _ in hits]

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        with unit_of_work() as uow:
            return PgVectorStore(uow.session).bucket_stats(tenant_id)

    def fingerprints(self, tenant_id: str) -> Fingerprints:
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            return store.fingerprints_in_buckets(tenant_id, list(store.bucket_stats(tenant_id)))

    def tenants(self) -> set[str]:
        with unit_of_work() as uow:
            return PgVectorStore(uow.session).tenants()

    def count_of_tenant(self, tenant_id: str) -> int:
        with unit_of_work() as uow:
            return PgVectorStore(uow.session).count_of_tenant(tenant_id)


class TestPgVectorStore(ChunkStoreContract):
    PORTS: ClassVar[Claims] = {
        **ChunkStoreContract.PORTS,
        ports.VectorWriter: ALL,
        ports.VectorSearch: {"nearest", "hydrate"},
        ports.VectorAudit: methods(ports.ChunkAudit) | {"bucket_stats"},
        ports.ReindexSource: {"count_of_tenant"},
    }

    @pytest.fixture
    def store(self, fresh_stores: None) -> PgVectorHarness:
        return PgVectorHarness()

    def test_hydration_serves_only_chunks_at_their_documents_live_version(
        self, store: PgVectorHarness
    ) -> None:
        tenant = _tenant()
        live, stale = Record(tenant, _doc(), "Live chunk."), Record(tenant, _doc(), "Stale one.")
        deleted = Record(tenant, _doc(), "A deleted document's chunk.")
        first = Record(tenant, _doc(), "Part one.")
        second = Record(tenant, first.document_id, "Part two.", ordinal=1)
        store.write([live, stale, deleted, first, second])
        with unit_of_work() as uow:
            docs = documents_repo.documents_by_ids(
                uow.session, [stale.document_id, deleted.document_id]
            )
            docs[stale.document_id].version = 2  # a newer version is being written
            docs[deleted.document_id].deleted = True
            docs[deleted.document_id].updated_at = now(uow.session)
        with unit_of_work() as uow:
            vector = _vector(live.text).tolist()
            rows = PgVectorStore(uow.session).hydrate(
                tenant, [live.id, stale.id, deleted.id, first.id], vector, [live.id]
            )
            elsewhere = PgVectorStore(uow.session).hydrate(_tenant(), [live.id], vector)
        assert set(rows) == {live.id, first.id}
        assert rows[live.id].cosine == pytest.approx(1.0, abs=1e-5)
        # a document's only chunk is the whole document; the first of two is not
        assert rows[live.id].whole_document and not rows[first.id].whole_document
        assert rows[live.id].embedding is not None and rows[live.id].external_id == live.external_id
        assert elsewhere == {}  # another tenant's id hydrates to nothing

    def test_a_search_left_less_than_its_transactions_limit_is_cancelled_at_that(
        self, store: PgVectorHarness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A dense arm that waited for its slot has less than the search's whole limit left:
        Postgres cancels it when that runs out, and the read transaction stays usable. With
        all of it left, the transaction's own limit is the one: no second one is sent."""
        tenant = _tenant()
        record = Record(tenant, _doc(), "Kelp forests shelter otters.")
        store.write([record])
        original = stores_repo.nearest_chunks

        def stalled(session: Any, *args: Any, **kwargs: Any) -> Any:
            session.execute(text("SELECT pg_sleep(5)"))
            return original(session, *args, **kwargs)

        vector = _vector(record.text).tolist()
        sent: list[str] = []

        def record_statement(*call: Any) -> None:
            sent.append(call[2])  # (connection, cursor, statement, ...)

        with unit_of_work() as uow:
            limit_statements(uow.session, 10)  # the search's own (shared/search/service.py)
            connection = uow.session.connection()
            event.listen(connection, "before_cursor_execute", record_statement)
            try:
                found = PgVectorStore(uow.session).nearest(tenant, vector, 1, within_s=10)
                with_all_left = list(sent)
                sent.clear()
                monkeypatch.setattr(stores_repo, "nearest_chunks", stalled)
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    PgVectorStore(uow.session).nearest(tenant, vector, 1, within_s=0.5)
                assert time.monotonic() - started < 4  # not the 5 s sleep, nor the 10 s limit
            finally:
                event.remove(connection, "before_cursor_execute", record_statement)
            timeout = uow.session.scalar(text("SELECT current_setting('statement_timeout')"))
        assert [cid for cid, _ in found] == [record.id]
        assert not any("statement_timeout" in statement for statement in with_all_left)
        assert any("statement_timeout" in statement for statement in sent)
        assert timeout == "10s"  # the transaction's own limit, back after the savepoint

    def test_the_hnsw_walk_keeps_the_contract_for_large_tenants(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A tenant in a partition of its own is searched through its own HNSW graph, with
        the iterative scan: the same tenant filter and metadata filters."""
        monkeypatch.setattr(vector_store, "_own_graph", {})
        store = PartitionedPgVectorHarness()
        self.test_search_stays_within_the_tenant_and_ranks_its_source_first(store)
        self.test_a_metadata_filter_means_the_same_in_every_store(store)

    def test_a_tenant_with_a_graph_is_searched_through_it_whatever_the_planner_estimates(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The dense arm of a tenant with a partition of its own walks that partition's HNSW
        graph, even where the planner costs a scan of every row lower (here: a partition of
        a few rows; on SciFact's after a reembed, a 31 ms sequential scan against a 4.7 ms
        walk)."""
        from sqlalchemy import text

        monkeypatch.setattr(vector_store, "_own_graph", {})
        tenant = _tenant()
        records = [Record(tenant, _doc(), f"harbour note {i}") for i in range(4)]
        PartitionedPgVectorHarness().write(records)
        with unit_of_work() as uow:
            partition, has_graph = stores_repo.own_partitions(uow.session)[tenant]
            hits = PgVectorStore(uow.session).nearest(tenant, _vector(records[2].text).tolist(), 3)
            walks = uow.session.scalar(
                text("SELECT pg_stat_get_xact_numscans(CAST(:index AS regclass))"),
                {"index": f"{partition}_embedding_hnsw"},
            )
        assert has_graph and walks == 1
        assert hits[0][0] == records[2].id and len(hits) == 3
        # Without a valid graph (while one is being built, or after a failed build) the
        # partition is scanned exactly instead: the graph dropped, in a transaction undone.
        vector_store._own_graph.clear()
        with unit_of_work() as uow:
            uow.session.execute(text(f'DROP INDEX "{partition}_embedding_hnsw"'))
            assert not stores_repo.has_own_graph(uow.session, partition)
            hits = PgVectorStore(uow.session).nearest(tenant, _vector(records[2].text).tolist(), 3)
            uow.session.rollback()
        assert hits[0][0] == records[2].id and len(hits) == 3
        vector_store._own_graph.clear()
        with unit_of_work() as uow:
            assert stores_repo.has_own_graph(uow.session, partition)  # the graph is back


class PartitionedPgVectorHarness(PgVectorHarness):
    """Every tenant it writes moves to a partition, and HNSW graph, of its own."""

    def write(self, records: list[Record]) -> None:
        super().write(records)
        for tenant in sorted({r.tenant_id for r in records}):
            # (waiting for a run of the suite's beat, if one is under way)
            partitions.place_tenants(unit_of_work, tenant_id=tenant, wait_s=10)
            with unit_of_work() as uow:
                assert stores_repo.own_partitions(uow.session)[tenant][1]  # a valid graph


# ------------------------------------------------------------------ Elasticsearch


class ElasticsearchHarness:
    """Writes copies the way the relay does (the copy's shape from chunk_document, the
    Postgres version as an external version); reads through ElasticsearchChunkIndex."""

    def __init__(self) -> None:
        self.index = ElasticsearchChunkIndex()

    def write(self, records: list[Record]) -> None:
        self.index.write([self._copy(r) for r in records], "external")
        self.index.refresh()

    @staticmethod
    def _copy(r: Record) -> tuple[Chunk, Document]:
        chunk = Chunk(
            id=r.id,
            tenant_id=r.tenant_id,
            document_id=r.document_id,
            version=r.version,
            ordinal=r.ordinal,
            text=r.text,
            text_hash=r.text_hash,
            char_start=0,
            char_end=len(r.text),
            section=r.section,
            title=r.title,
            token_count=len(r.text.split()),
            bucket=bucket_of(r.id),
            fingerprint=r.fingerprint,
            metadata_=r.metadata,
        )
        return chunk, Document(id=r.document_id, tenant_id=r.tenant_id, external_id=r.external_id)

    def delete(self, record: Record, version: int) -> None:
        action = {"_id": record.id, "version": version, "version_type": "external"}
        [item] = self.index.bulk([(record.tenant_id, [{"delete": action}])])["items"]
        assert item["delete"]["status"] == 200
        self.index.refresh()

    def search(
        self, tenant_id: str, like: Record, size: int, filters: Filters | None = None
    ) -> list[str]:
        return [cid for cid, _ in self.index.lexical_search(tenant_id, like.text, filters, size)]

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        stats, unbucketed = self.index.bucket_stats(tenant_id)
        assert unbucketed == 0
        return stats

    def fingerprints(self, tenant_id: str) -> Fingerprints:
        return self.index.fingerprints_in_buckets(tenant_id, list(self.bucket_stats(tenant_id)))

    def tenants(self) -> set[str]:
        return self.index.tenants()

    def count_of_tenant(self, tenant_id: str) -> int:
        return self.index.count_of_tenant(tenant_id)


class TestElasticsearchChunkIndex(ChunkStoreContract):
    PORTS: ClassVar[Claims] = {
        **ChunkStoreContract.PORTS,
        ports.ChunkWriter: {"write", "bulk", "exists"},
        ports.LexicalSearch: {"lexical_search"},
        ports.IndexAudit: methods(ports.IndexAudit) - {"foreign_copies"},
        ports.IndexHealth: ALL,
    }

    @pytest.fixture
    def store(self, fresh_stores: None) -> ElasticsearchHarness:
        return ElasticsearchHarness()

    def test_a_write_answers_per_item_and_exists_sees_it(self, store: ElasticsearchHarness) -> None:
        record = Record(_tenant(), _doc(), "Per-item answers.", version=2)
        store.write([record])
        statuses = store.index.write([store._copy(record.at_version(1))], "external")
        assert statuses == [409]  # an older version: refused, for this item alone
        tenant, document = record.tenant_id, str(record.document_id)
        assert store.index.exists(tenant, record.id)
        assert not store.index.exists(tenant, "absent:0") and not store.index.exists(_tenant(), "x")
        assert store.index.count_of_document(tenant, document) == 1
        assert store.index.count_of_document(tenant, document, version=1) == 0
        assert store.index.reindex_target() is None
        assert store.index.cluster_status(timeout_s=2) in ("green", "yellow")

    def test_copies_carry_a_fingerprint_recomputed_from_their_fields(
        self, store: ElasticsearchHarness
    ) -> None:
        tenant = _tenant()
        records = [Record(tenant, _doc(), f"Copy {i}.", metadata={"i": i}) for i in range(3)]
        store.write(records)
        copies = store.index.copies_in_buckets(tenant, list(store.bucket_stats(tenant)))
        for r in records:
            copy = copies[r.id]
            assert copy.stored_fingerprint == copy.fields_fingerprint == r.fingerprint
            assert (copy.tenant_id, copy.version, copy.es_version) == (tenant, 1, 1)
        assert store.index.copies_by_ids([*_ids(records), "absent:0"], page=1) == copies


# ------------------------------------------------------------------ both, after ingestion


@pytest.fixture
def ingested(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> Iterator[str]:
    """Three documents through the real pipeline and relay, converged in both stores."""
    for i in range(3):
        up = upload_text(client, auth, f"contract-{i}", f"Contract note {i} on tidal flats.")
        wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    yield tenant


def test_after_ingestion_both_stores_report_the_same_buckets_and_fingerprints(
    ingested: str, client: TestClient
) -> None:
    tenant = ingested
    pg, es = PgVectorHarness(), ElasticsearchHarness()
    es.index.refresh()
    assert pg.bucket_stats(tenant) == es.bucket_stats(tenant) != {}
    assert pg.fingerprints(tenant) == es.fingerprints(tenant)
    assert tenant in pg.tenants() and tenant in es.tenants()
    other = f"{tenant}-other"
    other_auth = key_headers(other, ["read", "write"])
    wait_job(
        client, other_auth, upload_text(client, other_auth, "x", "Tidal flats, too.")["job_id"]
    )
    wait_converged(other)
    es.index.refresh()
    assert es.count_of_tenant(other) == pg.count_of_tenant(other) == 1
    assert es.index.count_of_tenant(None) >= es.count_of_tenant(tenant) + 1
