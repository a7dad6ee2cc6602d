"""A contract per store port (shared/stores/ports.py), run against every adapter that
implements it: what each audience of a store relies on, method by method.

``ChunkAudit``, the part both stores share for reconciliation, is ``ChunkStoreContract`` of
test_stores.py, which every adapter passes; the classes below hold the other ports. Each class
claims the port methods its tests call (PORTS, checked while it runs: port_calls.py), and the
last test proves the claims cover every method of every port."""

from __future__ import annotations

import inspect
import sys
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from shared.db import unit_of_work
from shared.settings import get_settings
from shared.stores import ports
from shared.stores.chunk_document import es_document
from shared.stores.chunk_index import ElasticsearchChunkIndex, ReindexOfAnotherScope
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from shared.stores.es_index import anchor_index, ensure_index, tenant_alias, tenant_index
from shared.stores.memory import MemorySnapshots, memory_stores
from shared.stores.schemas import ReindexStart
from shared.stores.vector_store import PgVectorStore
from tests.contract import test_queue, test_stores
from tests.contract.port_calls import ALL, Claims, claimed, declared_ports, methods
from tests.contract.test_stores import (
    ElasticsearchHarness,
    PgVectorHarness,
    Record,
    _doc,
    _tenant,
    _vector,
)
from tests.unit.stores import test_memory_stores


def _lines(record: Record) -> list[dict[str, Any]]:
    """A record's bulk lines as the relay sends them."""
    action = {"_id": record.id, "version": record.version, "version_type": "external"}
    return [{"index": action}, es_document(*ElasticsearchHarness._copy(record))]


@pytest.fixture
def own_index(fresh_stores: None) -> Iterator[ElasticsearchChunkIndex]:
    """An index layout of its own (another prefix): a reindex switches every alias of its
    layout, and no other test's copies may move meanwhile."""
    prefix = f"contract-{uuid.uuid4().hex[:8]}"
    settings = get_settings().model_copy(update={"es_index_prefix": prefix})
    ensure_index(settings)
    yield ElasticsearchChunkIndex(settings=settings)
    get_es().indices.delete(index=f"{prefix}-*", allow_no_indices=True, expand_wildcards="all")


# ------------------------------------------------------------------ Elasticsearch's ports


class TestChunkWriterPort:
    """The relay's writes (bulk, write, exists and reindex_target: test_stores.py)."""

    PORTS: ClassVar[Claims] = {ports.ChunkWriter: ALL, ports.IndexReindex: ALL}

    def test_prepare_makes_a_tenants_index_and_forget_has_it_checked_again(
        self, own_index: ElasticsearchChunkIndex
    ) -> None:
        tenant = _tenant()
        assert own_index.prepare([tenant]) == {}
        assert tenant in own_index.tenants() and own_index.count_of_tenant(tenant) == 0
        es = get_es()
        [concrete] = es.indices.get_alias(name=tenant_alias(own_index.settings, tenant))
        es.indices.delete(index=concrete)  # gone behind the process's back
        own_index.forget(tenant)  # as the relay does on a 404
        assert own_index.prepare([tenant]) == {}
        record = Record(tenant, _doc(), "Written after the index came back.")
        [item] = own_index.bulk([(tenant, _lines(record))])["items"]
        assert item["index"]["status"] == 201
        assert own_index.exists(tenant, record.id)

    def test_a_reindex_copies_dual_writes_and_switches_every_alias(
        self, own_index: ElasticsearchChunkIndex
    ) -> None:
        """IndexReindex and ChunkWriter.bulk_to together: the copies of a page, a write made
        while the next generation is built (sent to both), then the atomic switch."""
        index, tenant = own_index, _tenant()
        first = Record(tenant, _doc(), "Puffins nest in burrows.")
        during = Record(tenant, _doc(), "Gannets dive from thirty metres.")
        assert index.write([ElasticsearchHarness._copy(first)], "external") == [201]
        assert index.per_tenant() and index.reindex_target() is None
        start = index.start_reindex()
        assert (start.last_id, start.resumed) == ("", False)
        assert index.reindex_target() == start.generation
        index.copy_to(start.generation, [ElasticsearchHarness._copy(first)])
        index.mark_reindex_progress(start.generation, first.id)
        assert index.start_reindex() == ReindexStart(start.generation, first.id, resumed=True)
        lines = [(tenant, _lines(during))]
        index.bulk(lines)
        index.bulk_to(start.generation, lines)  # the relay's dual write
        old = index.finish_reindex(start.generation)
        assert old and all(start.generation not in name for name in old)
        assert index.reindex_target() is None
        index.refresh(tenant)
        stats, unbucketed = index.bucket_stats(tenant)
        assert unbucketed == 0
        assert set(index.fingerprints_in_buckets(tenant, list(stats))) == {first.id, during.id}

    def test_a_reindex_of_one_tenant_dual_writes_and_switches_that_tenant_alone(
        self, own_index: ElasticsearchChunkIndex
    ) -> None:
        """A generation that rebuilds one tenant: only that tenant's dual writes reach it,
        its switch moves only that tenant's aliases, and while it waits to be resumed no
        reindex of other tenants starts."""
        index, tenant, other = own_index, _tenant(), _tenant()
        ours = Record(tenant, _doc(), "Puffins nest in burrows.")
        theirs = Record(other, _doc(), "Gannets dive from thirty metres.")
        assert index.write([ElasticsearchHarness._copy(r) for r in (ours, theirs)], "external")
        es = get_es()
        [their_index] = es.indices.get_alias(name=tenant_alias(index.settings, other))
        [our_old_index] = es.indices.get_alias(name=tenant_alias(index.settings, tenant))
        start = index.start_reindex(tenant)
        assert (start.last_id, start.resumed) == ("", False)
        assert index.reindex_target() == start.generation
        for elsewhere in (None, other):
            with pytest.raises(ReindexOfAnotherScope, match=f"--tenant {tenant}"):
                index.start_reindex(elsewhere)
        index.copy_to(start.generation, [ElasticsearchHarness._copy(ours)])
        index.mark_reindex_progress(start.generation, ours.id)
        assert index.start_reindex(tenant) == ReindexStart(start.generation, ours.id, True)
        during = [Record(t, _doc(), "Written while it is rebuilt.") for t in (tenant, other)]
        lines = [(record.tenant_id, _lines(record)) for record in during]
        index.bulk(lines)
        [item] = index.bulk_to(start.generation, lines)["items"]  # ours only
        assert item["index"]["_id"] == during[0].id
        assert not es.indices.exists(index=tenant_index(index.settings, start.generation, other))
        old = index.finish_reindex(start.generation)
        assert our_old_index in old and their_index not in old
        assert index.reindex_target() is None
        assert list(es.indices.get_alias(name=tenant_alias(index.settings, other))) == [their_index]
        [rebuilt] = es.indices.get_alias(name=tenant_alias(index.settings, tenant))
        assert start.generation in rebuilt
        assert index.layout(fresh=True).generation not in (None, start.generation)
        for t, expected in ((tenant, {ours.id, during[0].id}), (other, {theirs.id, during[1].id})):
            index.refresh(t)
            stats, _ = index.bucket_stats(t)
            assert set(index.fingerprints_in_buckets(t, list(stats))) == expected
        assert not es.indices.exists(index=anchor_index(index.settings, start.generation))

    def test_a_reindex_of_one_tenant_needs_the_per_tenant_layout(self) -> None:
        """On the shared layout (one index for every tenant) only a reindex of every tenant
        can run: it is the one that gives each tenant its own index."""
        prefix = f"contract-{uuid.uuid4().hex[:8]}"
        settings = get_settings().model_copy(update={"es_index_prefix": prefix})
        es = get_es()
        es.indices.create(index=f"{prefix}-chunks-v1", aliases={f"{prefix}-chunks": {}})
        try:
            with pytest.raises(ReindexOfAnotherScope, match="shared layout"):
                ElasticsearchChunkIndex(settings=settings).start_reindex(_tenant())
            assert not es.indices.exists_alias(name=f"{prefix}-chunks-reindexing")
        finally:
            es.indices.delete(index=f"{prefix}-*", allow_no_indices=True)


class TestLexicalSearchPort:
    """The lexical arm (lexical_search: test_stores.py's shared contract)."""

    PORTS: ClassVar[Claims] = {ports.LexicalSearch: {"term_counts"}}

    def test_term_counts_are_counted_within_the_tenant(self) -> None:
        harness, tenant, other = ElasticsearchHarness(), _tenant(), _tenant()
        harness.write(
            [
                Record(tenant, _doc(), "Kelp forests shelter otters."),
                Record(tenant, _doc(), "Kelp grows fast."),
                Record(tenant, _doc(), "Bees dance."),
                Record(other, _doc(), "Kelp, kelp and more kelp."),
            ]
        )
        counts = harness.index.term_counts(tenant, ["kelp", "bee", "walrus"])
        assert counts == (3, {"kelp": 2, "bee": 1, "walrus": 0})  # stemmed terms
        assert harness.index.term_counts(_tenant(), ["kelp"]) == (0, {"kelp": 0})


class TestIndexAuditPort:
    """Reconciliation's reads of the index (the rest: test_stores.py)."""

    PORTS: ClassVar[Claims] = {ports.IndexAudit: {"foreign_copies", "refresh"}}

    def test_a_copy_that_strayed_into_another_tenants_index_is_foreign_there(self) -> None:
        harness, owner, host = ElasticsearchHarness(), _tenant(), _tenant()
        harness.write([Record(host, _doc(), "The host's own note.")])
        strayed = Record(owner, _doc(), "A copy in the wrong tenant's index.")
        harness.index.bulk([(host, _lines(strayed))])
        harness.index.refresh(host)
        foreign = harness.index.foreign_copies(host)
        assert set(foreign) == {strayed.id} and foreign[strayed.id].tenant_id == owner
        assert foreign[strayed.id].index_tenant == host
        assert harness.index.foreign_copies(owner) == {}


# ------------------------------------------------------------------ Postgres's ports


def _written() -> tuple[str, str, list[Record]]:
    """Two chunks of one document (two sections) with metadata, one of another document, and
    one chunk of another tenant."""
    tenant, other, document = _tenant(), _tenant(), _doc()
    records = [
        Record(
            tenant,
            document,
            "Terns fly far.",
            title="Seabirds",
            section="s1",
            metadata={"year": 2020},
        ),
        Record(
            tenant,
            document,
            "Terns nest.",
            ordinal=1,
            title="Seabirds",
            section="s2",
            metadata={"year": 2020},
        ),
        Record(tenant, _doc(), "Skuas steal fish."),
        Record(other, _doc(), "Another tenant's terns."),
    ]
    return tenant, other, records


@pytest.fixture
def written(fresh_stores: None) -> tuple[str, str, list[Record]]:
    """:func:`_written`'s chunks, written through the Postgres harness."""
    tenant, other, records = _written()
    PgVectorHarness().write(records)
    return tenant, other, records


class TestVectorSearchPort:
    """The dense arm's reads (nearest and hydrate: test_stores.py), in Postgres and in
    memory."""

    PORTS: ClassVar[Claims] = {ports.VectorSearch: {"embeddings", "hydrate", "metadata_values"}}

    @pytest.mark.parametrize("kind", ["postgres", "memory"])
    def test_embeddings_rows_and_metadata_values_are_read_within_the_tenant(
        self, kind: str, fresh_stores: None
    ) -> None:
        tenant, other, records = _written()
        if kind == "memory":
            memory = test_memory_stores.MemoryVectorHarness()
            memory.write(records)
            self._reads_within_the_tenant(memory.store, tenant, other, records)
            return
        PgVectorHarness().write(records)
        with unit_of_work() as uow:
            self._reads_within_the_tenant(PgVectorStore(uow.session), tenant, other, records)

    @staticmethod
    def _reads_within_the_tenant(
        store: ports.VectorSearch, tenant: str, other: str, records: list[Record]
    ) -> None:
        a, b, c, theirs = records
        vectors = store.embeddings(tenant, [a.id, c.id, theirs.id])
        assert set(vectors) == {a.id, c.id}
        assert np.allclose(vectors[a.id], _vector(a.text), atol=1e-6)
        assert store.metadata_values(tenant, [a.id, b.id, c.id], "year") == {
            a.id: 2020, b.id: 2020
        }  # fmt: skip
        assert store.metadata_values(other, [a.id], "year") == {}
        # What the passages stage reads of its candidates (and the first page then serves).
        rows = store.hydrate(tenant, [a.id, b.id, theirs.id], None)
        assert {cid: (r.text, r.section, r.title) for cid, r in rows.items()} == {
            a.id: (a.text, "s1", "Seabirds"), b.id: (b.text, "s2", "Seabirds")
        }  # fmt: skip


class TestVectorAuditPort:
    """Reconciliation's reads of Postgres (bucket_stats: test_stores.py)."""

    PORTS: ClassVar[Claims] = {
        ports.VectorAudit: {"fingerprints_by_ids", "owners", "chunks_by_ids"},
        ports.VectorReads: {"chunks_by_ids"},
    }

    def test_fingerprints_owners_and_chunks_by_id(
        self, written: tuple[str, str, list[Record]]
    ) -> None:
        tenant, other, (a, _, _, theirs) = written
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            assert store.fingerprints_by_ids(tenant, [a.id, theirs.id, "absent:0"]) == {
                a.id: (1, a.fingerprint)
            }
            assert store.fingerprints_by_ids(tenant, []) == {}
            assert store.owners([a.id, theirs.id, "absent:0"]) == {a.id: tenant, theirs.id: other}
            chunks = store.chunks_by_ids([a.id, theirs.id, "absent:0"])
            assert {cid: chunk.tenant_id for cid, chunk in chunks.items()} == {
                a.id: tenant, theirs.id: other
            }  # fmt: skip
            assert chunks[a.id].text == a.text


class TestReindexSourcePort:
    """Reindex's reads of Postgres (count_of_tenant: test_stores.py)."""

    PORTS: ClassVar[Claims] = {ports.ReindexSource: {"count_up_to", "page_after"}}

    def test_pages_follow_id_order_and_counts_say_where_a_run_resumes(
        self, written: tuple[str, str, list[Record]]
    ) -> None:
        ids = sorted(r.id for r in written[2])
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            before, through = store.count_up_to(ids[0]), store.count_up_to(ids[-1])
            assert through - before >= len(ids) - 1
            page = store.page_after(ids[0], through - before + 50)
        page_ids = [chunk.id for chunk, _ in page]
        assert page_ids == sorted(page_ids) and page_ids[0] > ids[0]
        assert set(ids[1:]) <= set(page_ids)
        assert all(doc.id == chunk.document_id for chunk, doc in page)

    def test_a_tenants_pages_and_counts_hold_its_chunks_only(
        self, written: tuple[str, str, list[Record]]
    ) -> None:
        tenant, other, records = written
        ours = sorted(r.id for r in records if r.tenant_id == tenant)
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            assert store.count_up_to(ours[-1], tenant) == len(ours)
            assert store.count_up_to(ours[0], tenant) == 1
            pages = [store.page_after("", 2, tenant), store.page_after(ours[1], 2, tenant)]
            assert store.page_after("", 10, other)[0][0].tenant_id == other
        assert [[chunk.id for chunk, _ in page] for page in pages] == [ours[:2], ours[2:]]


class TestVectorReadsPort:
    """The document view's reads (chunks_by_ids: above)."""

    PORTS: ClassVar[Claims] = {ports.VectorReads: {"document_chunks", "count_of_document"}}

    def test_a_documents_chunks_in_order_by_section_and_counted(
        self, written: tuple[str, str, list[Record]]
    ) -> None:
        tenant, other, (a, b, _, _) = written
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            assert [c.id for c in store.document_chunks(tenant, a.document_id)] == [a.id, b.id]
            assert [c.id for c in store.document_chunks(tenant, a.document_id, "s2")] == [b.id]
            assert list(store.document_chunks(other, a.document_id)) == []
            assert store.count_of_document(a.document_id) == 2


class TestCorpusSamplePort:
    """Calibration's draw of a tenant's chunk texts."""

    PORTS: ClassVar[Claims] = {ports.CorpusSample: ALL}

    def test_a_sample_is_the_tenants_own_and_repeats_for_one_seed(
        self, written: tuple[str, str, list[Record]]
    ) -> None:
        tenant, other, records = written
        own = {r.text for r in records if r.tenant_id == tenant}
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            drawn = store.sample_texts(tenant, 2, seed=0.25)
            assert len(drawn) == 2 and set(drawn) <= own
            assert store.sample_texts(tenant, 2, seed=0.25) == drawn
            assert set(store.sample_texts(tenant, 10)) == own  # never another tenant's
            counts = store.counts_by_tenant()
        assert (counts[tenant], counts[other]) == (3, 1)


class TestCachedEmbeddingsPort:
    """The embed step's cache: a vector comes back under the model and key it was kept by,
    a key never kept is not there, and the first vector kept under a key stays (two workers
    encoding the same text at once keep one)."""

    PORTS: ClassVar[Claims] = {ports.CachedEmbeddings: ALL}

    @pytest.mark.parametrize("kind", ["postgres", "memory"])
    def test_a_vector_comes_back_under_its_model_and_key(
        self, fresh_stores: None, kind: str
    ) -> None:
        cache = (
            connect().embeddings(unit_of_work)
            if kind == "postgres"
            else memory_stores().embeddings(unit_of_work)
        )
        model, other_model = f"model-{uuid.uuid4().hex[:8]}", f"model-{uuid.uuid4().hex[:8]}"
        first, second = _vector("heron"), _vector("egret")
        cache.keep(model, {"k1": first})
        cache.keep(model, {"k1": second, "k2": second})  # k1 kept already: the first stays
        found = cache.cached(model, ["k1", "k2", "never kept"])
        assert set(found) == {"k1", "k2"}
        np.testing.assert_allclose(found["k1"], first, atol=1e-6)
        np.testing.assert_allclose(found["k2"], second, atol=1e-6)
        assert cache.cached(other_model, ["k1"]) == {}
        assert cache.cached(model, []) == {}


# ------------------------------------------------------------------ Redis's port


class TestSnapshotStorePort:
    """A paginated search's kept rankings: a snapshot comes back as it was put, an id never
    put (or dropped) is None, and a tenant past its cap loses its own oldest, not another's."""

    PORTS: ClassVar[Claims] = {ports.SnapshotStore: ALL}

    @pytest.mark.parametrize("kind", ["redis", "memory"])
    def test_a_snapshot_comes_back_as_it_was_put(self, fresh_stores: None, kind: str) -> None:
        snapshots = connect().snapshots if kind == "redis" else MemorySnapshots()
        tenant = _tenant()
        snapshots.put(tenant, "a" * 22, b"\x00compressed ranking")
        assert snapshots.get("a" * 22) == b"\x00compressed ranking"
        assert snapshots.get("b" * 22) is None

    def test_a_tenant_past_its_cap_drops_its_own_oldest(self, fresh_stores: None) -> None:
        settings = get_settings().model_copy(update={"search_cursors_per_tenant": 2})
        snapshots = connect(settings).snapshots
        tenant, other = _tenant(), _tenant()
        snapshots.put(other, "o" * 22, b"theirs")
        for i in range(3):
            snapshots.put(tenant, f"{i}" * 22, f"mine {i}".encode())
        assert snapshots.get("0" * 22) is None  # the oldest, dropped for the newest
        assert (snapshots.get("1" * 22), snapshots.get("2" * 22)) == (b"mine 1", b"mine 2")
        assert snapshots.get("o" * 22) == b"theirs"


# ------------------------------------------------------------------ every method is exercised


def _contract_classes() -> list[type[Any]]:
    modules = (sys.modules[__name__], test_stores, test_memory_stores, test_queue)
    return [
        member
        for module in modules
        for member in vars(module).values()
        if inspect.isclass(member) and member.__module__ == module.__name__
        if member.__name__.startswith("Test") and hasattr(member, "PORTS")  # the collected ones
    ]


def test_every_method_of_every_port_is_claimed_by_a_contract() -> None:
    """Each class's claims are checked while it runs (port_calls.py); together they must
    cover every method of every port."""
    claims: dict[type[Any], set[str]] = {}
    for holder in _contract_classes():
        for port, names in claimed(holder.PORTS).items():
            claims.setdefault(port, set()).update(names)
    assert set(claims) == declared_ports()
    unclaimed = {
        port.__name__: sorted(methods(port) - names)
        for port, names in claims.items()
        if methods(port) - names
    }
    assert not unclaimed, unclaimed
