"""The in-memory stores (shared/stores/memory/) pass the contract the real ones pass:
``ChunkStoreContract`` of tests/contract/test_stores.py, the same test class, with a harness
per store, here with no service running. Then what the stages above the stores rely on and
the contract does not state: hydration serves live chunks only, BM25 prefers the rarer term
and the boosted field, the bulk answers and versions are Elasticsearch's."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from shared.models import Chunk, Document
from shared.stores.buckets import bucket_of
from shared.stores.filters import Filters, passes
from shared.stores.memory import MemoryChunkIndex, MemoryVectorStore
from shared.stores.schemas import BucketStats, ChunkRow, Fingerprints, VersionChunks
from tests.contract.test_stores import ChunkStoreContract, Record, _doc, _tenant, _vector


def version_of(r: Record) -> VersionChunks:
    row = ChunkRow(
        id=r.id, ordinal=r.ordinal, text=r.text, text_hash=r.text_hash, char_start=0,
        char_end=len(r.text), section=r.section, token_count=len(r.text.split()),
        embedding=_vector(r.text),
    )  # fmt: skip
    return VersionChunks(
        r.tenant_id, r.document_id, r.version, r.external_id, r.title, r.metadata, [row]
    )


def copy_of(r: Record) -> tuple[Chunk, Document]:
    chunk = Chunk(
        id=r.id, tenant_id=r.tenant_id, document_id=r.document_id, version=r.version,
        ordinal=r.ordinal, text=r.text, text_hash=r.text_hash, char_start=0,
        char_end=len(r.text), section=r.section, title=r.title,
        token_count=len(r.text.split()), bucket=bucket_of(r.id), fingerprint=r.fingerprint,
        metadata_=r.metadata,
    )  # fmt: skip
    return chunk, Document(id=r.document_id, tenant_id=r.tenant_id, external_id=r.external_id)


class MemoryVectorHarness:
    def __init__(self) -> None:
        self.store = MemoryVectorStore()

    def write(self, records: list[Record]) -> None:
        for r in records:  # one version per upsert, as the pipeline writes a document
            self.store.upsert([version_of(r)])

    def delete(self, record: Record, version: int) -> None:
        self.store.delete_superseded({record.document_id: version})

    def search(
        self, tenant_id: str, like: Record, size: int, filters: Filters | None = None
    ) -> list[str]:
        hits = self.store.nearest(tenant_id, _vector(like.text).tolist(), size, filters)
        return [cid for cid, _ in hits]

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        return self.store.bucket_stats(tenant_id)

    def fingerprints(self, tenant_id: str) -> Fingerprints:
        buckets = list(self.store.bucket_stats(tenant_id))
        return self.store.fingerprints_in_buckets(tenant_id, buckets)

    def tenants(self) -> set[str]:
        return self.store.tenants()

    def count_of_tenant(self, tenant_id: str) -> int:
        return self.store.count_of_tenant(tenant_id)


class MemoryIndexHarness:
    def __init__(self) -> None:
        self.index = MemoryChunkIndex()

    def write(self, records: list[Record]) -> None:
        self.index.write([copy_of(r) for r in records], "external")

    def delete(self, record: Record, version: int) -> None:
        action = {"_id": record.id, "version": version, "version_type": "external"}
        [item] = self.index.bulk([(record.tenant_id, [{"delete": action}])])["items"]
        assert item["delete"]["status"] == 200

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


class TestMemoryVectorStore(ChunkStoreContract):
    @pytest.fixture
    def store(self) -> MemoryVectorHarness:
        return MemoryVectorHarness()

    def test_hydration_serves_only_chunks_at_their_documents_live_version(
        self, store: MemoryVectorHarness
    ) -> None:
        tenant = _tenant()
        live, stale = Record(tenant, _doc(), "Live chunk."), Record(tenant, _doc(), "Stale one.")
        first = Record(tenant, _doc(), "Part one.")
        second = Record(tenant, first.document_id, "Part two.", ordinal=1)
        store.write([live, stale, first, second])
        store.store.documents[stale.document_id].version = 2  # a newer version is being written
        vector = _vector(live.text).tolist()
        rows = store.store.hydrate(tenant, [live.id, stale.id, first.id], vector, [live.id])
        assert set(rows) == {live.id, first.id}
        assert rows[live.id].cosine == pytest.approx(1.0, abs=1e-5)
        assert rows[live.id].whole_document and not rows[first.id].whole_document
        assert rows[live.id].embedding is not None and rows[first.id].embedding is None
        assert rows[live.id].external_id == live.external_id
        assert store.store.hydrate(_tenant(), [live.id], vector) == {}  # another tenant's id

    def test_a_newer_versions_fewer_chunks_remove_the_rest(
        self, store: MemoryVectorHarness
    ) -> None:
        tenant, doc = _tenant(), _doc()
        store.write([Record(tenant, doc, f"Part {i}.", ordinal=i) for i in range(3)])
        store.write([Record(tenant, doc, "All in one now.", version=2)])
        removed = store.store.delete_superseded({doc: 2}, chunk_counts={doc: 1})
        assert removed == {doc: [f"{doc}:1", f"{doc}:2"]}
        assert [c.text for c in store.store.document_chunks(tenant, doc)] == ["All in one now."]


class TestMemoryChunkIndex(ChunkStoreContract):
    @pytest.fixture
    def store(self) -> MemoryIndexHarness:
        return MemoryIndexHarness()

    def test_versions_and_tombstones_as_elasticsearch_keeps_them(
        self, store: MemoryIndexHarness
    ) -> None:
        record = Record(_tenant(), _doc(), "Per-item answers.", version=2)
        store.write([record])
        assert store.index.write([copy_of(record.at_version(1))], "external") == [409]
        assert store.index.write([copy_of(record.at_version(2))], "external") == [409]
        assert store.index.write([copy_of(record.at_version(2))], "external_gte") == [200]
        store.delete(record, version=3)
        # the tombstone refuses a late write of an older version, as Elasticsearch's does
        assert store.index.write([copy_of(record.at_version(2))], "external") == [409]
        assert not store.index.exists(record.tenant_id, record.id)
        answer = store.index.bulk([(record.tenant_id, [{"delete": {"_id": "absent:0"}}])])
        assert answer == {
            "errors": False,
            "items": [{"delete": {"_id": "absent:0", "status": 404}}],
        }

    def test_bm25_prefers_the_rarer_term_and_counts_terms_per_tenant(
        self, store: MemoryIndexHarness
    ) -> None:
        tenant = _tenant()
        common = [Record(tenant, _doc(), f"Harbour report {i} on seals.") for i in range(4)]
        rare = Record(tenant, _doc(), "Harbour report on the narwhal.")
        store.write([*common, rare])
        [(best, _), *_] = store.index.lexical_search(tenant, "harbour narwhal", None, 3)
        assert best == rare.id
        assert store.index.lexical_search(tenant, "the of and", None, 3) == []  # stop words
        assert store.index.term_counts(tenant, ["harbour", "narwhal"]) == (
            5, {"harbour": 5, "narwhal": 1},
        )  # fmt: skip
        assert store.index.term_counts(_tenant(), ["harbour"]) == (0, {"harbour": 0})

    def test_a_reindex_builds_a_generation_beside_the_live_copies_then_switches(
        self, store: MemoryIndexHarness
    ) -> None:
        tenant = _tenant()
        kept, rewritten = Record(tenant, _doc(), "Kept."), Record(tenant, _doc(), "Old text.")
        store.write([kept, rewritten])
        start = store.index.start_reindex()
        assert store.index.reindex_target() == start.generation and not start.resumed
        store.index.copy_to(start.generation, [copy_of(kept), copy_of(rewritten.at_version(2))])
        assert store.index.start_reindex().resumed
        store.index.finish_reindex(start.generation)
        assert store.fingerprints(tenant)[rewritten.id][0] == 2
        assert store.index.reindex_target() is None


def test_filters_mean_what_postgres_reads() -> None:
    document = str(uuid.uuid4())
    meta = {"year": 2020, "flag": True, "when": "2024-05-01", "team": "a"}

    def f(metadata: dict[str, object], ids: list[str] | None = None) -> bool:
        filters = Filters.model_validate({"metadata": metadata, "document_ids": ids})
        return passes(filters, meta, document)

    assert f({"year": 2020}) and not f({"year": 2021}) and not f({"flag": 1})
    assert f({"team": ["b", "a"]}) and not f({"absent": "a"})
    assert f({"year": {"gte": 2020, "lt": 2021}}) and not f({"team": {"gt": 1}})
    assert f({"when": {"gte": "2024-01-01"}}) and not f({"when": {"lt": "2024-01-01"}})
    assert f({}, [document]) and not f({}, [str(uuid.uuid4())])


def test_cosine_is_that_of_unit_vectors() -> None:
    """Vectors of any length are compared by direction, as pgvector's cosine distance does."""
    store = MemoryVectorStore()
    record = Record(_tenant(), _doc(), "Scaled.")
    version = version_of(record)
    long_row = replace(version.rows[0], embedding=5 * version.rows[0].embedding)
    store.upsert([replace(version, rows=[long_row])])
    query = (3 * _vector(record.text)).tolist()
    [(cid, cosine)] = store.nearest(record.tenant_id, query, 1)
    assert cid == record.id and cosine == pytest.approx(1.0, abs=1e-5)
