"""In-memory stores: the vector store and the chunk index as Python objects, for unit tests of
the stages above the stores (retrieval, fusion, hydration, decision, paging, the ingest
pipeline's writes) with no service running.

They keep the contract the real adapters keep, and prove it the same way: the parametrized
suite of tests/contract runs against both (``ChunkStoreContract``). What they share with the
real stores is code, not a copy of it: the BM25 arm analyzes text with the Python English
analysis the Elasticsearch copies are indexed with (shared/stores/english_analysis.py), the
copies are built by shared/stores/chunk_document.py, fingerprints and buckets by
shared/stores/buckets.py. Scores follow Elasticsearch's BM25 (k1 1.2, b 0.75, a best-fields
``multi_match`` with the same boosts and tie breaker) and pgvector's cosine.

A ``MemoryVectorStore`` stands for the vector store in every transaction (writes are seen at
once, nothing is rolled back); build both with :func:`memory_stores`.
"""

from __future__ import annotations

import itertools
import math
import operator
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from shared.errors import Conflict
from shared.models import Chunk, Document
from shared.settings import Settings, get_settings
from shared.stores import english_analysis
from shared.stores.buckets import bucket_of, fingerprint, fingerprint_of_source
from shared.stores.chunk_document import es_document
from shared.stores.compose import Stores
from shared.stores.filters import Filters, Range
from shared.stores.schemas import (
    BucketStats,
    EsCopy,
    Fingerprints,
    IndexUnavailable,
    ReindexStart,
    TenantLines,
    VersionChunks,
)
from shared.vector_type import PackedVector

if TYPE_CHECKING:
    from shared.stores.chunk_index import ChunkIndex
    from shared.stores.vector_store import VectorStore

BM25_K1, BM25_B = 1.2, 0.75  # Elasticsearch's defaults


def memory_stores(settings: Settings | None = None) -> Stores:
    """Both stores in memory, as a composition root would pass the real ones."""
    vectors = MemoryVectorStore()
    return Stores(MemoryChunkIndex(settings), lambda _session: vectors, MemorySnapshots())


class MemorySnapshots:
    """Snapshots in a dictionary, kept until the process ends (no time to live, no cap)."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    def put(self, tenant_id: str, snapshot_id: str, blob: bytes) -> None:
        self.kept[snapshot_id] = blob

    def get(self, snapshot_id: str) -> bytes | None:
        return self.kept.get(snapshot_id)


# ------------------------------------------------------------------ filters


def passes(filters: Filters | None, metadata: Mapping[str, Any], document_id: str) -> bool:
    """Whether a chunk passes ``filters`` as Postgres reads them (shared/stores/filters.py):
    equality and IN compare JSON values (true is not 1), a range holds for a number (or an
    ISO-8601 date, compared as text) within its bounds, and a key missing never matches."""
    if filters is None:
        return True
    if filters.document_ids and uuid.UUID(document_id) not in filters.document_ids:
        return False
    for key, condition in filters.metadata.items():
        if key not in metadata:
            return False
        value = metadata[key]
        if isinstance(condition, Range):
            if not _in_range(value, condition):
                return False
        elif isinstance(condition, list):
            if not any(_same_json(value, wanted) for wanted in condition):
                return False
        elif not _same_json(value, condition):
            return False
    return True


def _same_json(value: Any, wanted: Any) -> bool:
    return isinstance(value, bool) == isinstance(wanted, bool) and value == wanted


def _in_range(value: Any, condition: Range) -> bool:
    if condition.is_date:
        if not isinstance(value, str):
            return False
    elif not isinstance(value, int | float) or isinstance(value, bool):
        return False
    compare = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}
    return all(compare[op](value, bound) for op, bound in condition.bounds().items())


# ------------------------------------------------------------------ the vector store


@dataclass
class _Row:
    """One chunk as the vector store holds it (the columns hydration reads by name)."""

    id: str
    tenant_id: str
    document_id: uuid.UUID
    version: int
    ordinal: int
    text: str
    text_hash: str
    char_start: int
    char_end: int
    section: str
    title: str
    token_count: int
    flags: list[str]
    first_sentence_tokens: int | None
    metadata: dict[str, Any]
    embedding: np.ndarray
    fingerprint: int
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_chunk(self) -> Chunk:
        return Chunk(
            id=self.id, tenant_id=self.tenant_id, document_id=self.document_id,
            version=self.version, ordinal=self.ordinal, text=self.text,
            text_hash=self.text_hash, char_start=self.char_start, char_end=self.char_end,
            section=self.section, title=self.title, token_count=self.token_count,
            bucket=bucket_of(self.id), fingerprint=self.fingerprint, metadata_=self.metadata,
            flags=self.flags, first_sentence_tokens=self.first_sentence_tokens,
        )  # fmt: skip


@dataclass
class _Live:
    """A document's live version, as the documents table says it."""

    tenant_id: str
    external_id: str
    version: int


class MemoryVectorStore:
    """Chunks, their vectors, and each document's live version, in dictionaries."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}
        self.documents: dict[uuid.UUID, _Live] = {}

    # -- writes

    def upsert(self, versions: Sequence[VersionChunks]) -> None:
        for v in versions:
            live = self.documents.get(v.document_id)
            if live is None or live.version <= v.version:
                self.documents[v.document_id] = _Live(v.tenant_id, v.external_id, v.version)
            for r in v.rows:
                held = self.rows.get(r.id)
                if held is not None and held.version > v.version:
                    continue  # an older version never replaces a newer one
                vector = np.asarray(r.embedding, dtype=np.float32)
                self.rows[r.id] = _Row(
                    id=r.id, tenant_id=v.tenant_id, document_id=v.document_id,
                    version=v.version, ordinal=r.ordinal, text=r.text, text_hash=r.text_hash,
                    char_start=r.char_start, char_end=r.char_end, section=r.section,
                    title=v.title, token_count=r.token_count, flags=list(r.flags),
                    first_sentence_tokens=r.first_sentence_tokens, metadata=dict(v.metadata),
                    embedding=vector / (np.linalg.norm(vector) or 1.0),
                    fingerprint=fingerprint(
                        chunk_id=r.id, tenant_id=v.tenant_id, document_id=str(v.document_id),
                        external_id=v.external_id, version=v.version, ordinal=r.ordinal,
                        text_hash=r.text_hash, title=v.title, section=r.section,
                        metadata=v.metadata,
                    ),
                )  # fmt: skip

    def delete_superseded(
        self, live_versions: dict[uuid.UUID, int], chunk_counts: dict[uuid.UUID, int] | None = None
    ) -> dict[uuid.UUID, list[str]]:
        """Each document's live version recorded (a tombstone's too), and its chunks older
        than it (or past its chunk count) removed."""
        removed: dict[uuid.UUID, list[str]] = {}
        for document_id, version in live_versions.items():
            live = self.documents.get(document_id)
            if live is not None:
                live.version = max(live.version, version)
            count = (chunk_counts or {}).get(document_id)
            gone = [
                row.id
                for row in self.rows.values()
                if row.document_id == document_id
                and (row.version < version or (count is not None and row.ordinal >= count))
            ]
            for chunk_id in gone:
                del self.rows[chunk_id]
            if gone:
                removed[document_id] = sorted(gone)
        return removed

    # -- search and hydration

    def nearest(
        self,
        tenant_id: str,
        vector: list[float],
        size: int,
        filters: Filters | None = None,
        *,
        within_s: float | None = None,
    ) -> list[tuple[str, float]]:
        query = _unit(vector)
        scored = [
            (row.id, float(row.embedding @ query))
            for row in self._of_tenant(tenant_id)
            if passes(filters, row.metadata, str(row.document_id))
        ]
        return sorted(scored, key=lambda hit: (-hit[1], hit[0]))[:size]

    def hydrate(
        self,
        tenant_id: str,
        ids: Sequence[str],
        vector: list[float] | None,
        embeddings_for: Sequence[str] = (),
    ) -> dict[str, Any]:
        query = None if vector is None else _unit(vector)
        wanted_embeddings = set(embeddings_for)
        found: dict[str, Any] = {}
        for chunk_id in ids:
            row = self.rows.get(chunk_id)
            if row is None or row.tenant_id != tenant_id or not self._is_live(row):
                continue
            live = self.documents[row.document_id]
            found[chunk_id] = replace_fields(
                row,
                external_id=live.external_id,
                whole_document=row.ordinal == 0 and not self._has_second(row),
                cosine=None if query is None else float(row.embedding @ query),
                embedding=(
                    PackedVector(row.embedding).data if chunk_id in wanted_embeddings else None
                ),
            )
        return found

    def embeddings(self, tenant_id: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {r.id: r.embedding for r in self._among(tenant_id, ids)}

    def texts(self, tenant_id: str, ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        return {r.id: (r.text, r.section) for r in self._among(tenant_id, ids)}

    def metadata_values(self, tenant_id: str, ids: Sequence[str], key: str) -> dict[str, Any]:
        return {r.id: r.metadata[key] for r in self._among(tenant_id, ids) if key in r.metadata}

    def document_chunks(
        self, tenant_id: str, document_id: uuid.UUID, section: str | None = None
    ) -> Sequence[Chunk]:
        rows = [
            r
            for r in self._of_tenant(tenant_id)
            if r.document_id == document_id
            and self._is_live(r)
            and (section is None or r.section == section)
        ]
        return [r.as_chunk() for r in sorted(rows, key=lambda r: r.ordinal)]

    # -- reads by id and counts

    def chunks_by_ids(self, ids: Sequence[str]) -> dict[str, Chunk]:
        return {cid: self.rows[cid].as_chunk() for cid in ids if cid in self.rows}

    def count_of_tenant(self, tenant_id: str | None, /) -> int:
        return sum(1 for r in self.rows.values() if tenant_id in (None, r.tenant_id))

    def count_of_document(self, document_id: uuid.UUID) -> int:
        return sum(1 for r in self.rows.values() if r.document_id == document_id)

    def counts_by_tenant(self) -> dict[str, int]:
        return dict(Counter(r.tenant_id for r in self.rows.values()))

    def sample_texts(self, tenant_id: str, size: int, seed: float = 0.0) -> list[str]:
        rows = sorted(self._of_tenant(tenant_id), key=lambda r: r.id)
        picked = np.random.default_rng(int(seed * 2**31)).permutation(len(rows))[:size]
        return [rows[i].text for i in picked]

    # -- reconciliation

    def tenants(self) -> set[str]:
        return {r.tenant_id for r in self.rows.values()}

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        return _bucket_sums((r.id, r.version, r.fingerprint) for r in self._of_tenant(tenant_id))

    def fingerprints_in_buckets(self, tenant_id: str, buckets: Sequence[int], /) -> Fingerprints:
        wanted = set(buckets)
        return {
            r.id: (r.version, r.fingerprint)
            for r in self._of_tenant(tenant_id)
            if bucket_of(r.id) in wanted
        }

    def fingerprints_by_ids(self, tenant_id: str, ids: Sequence[str]) -> Fingerprints:
        return {r.id: (r.version, r.fingerprint) for r in self._among(tenant_id, ids)}

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        return {cid: self.rows[cid].tenant_id for cid in ids if cid in self.rows}

    # -- reindex

    def count_up_to(self, last_id: str, tenant_id: str | None = None) -> int:
        return sum(
            1 for r in self.rows.values() if r.id <= last_id and tenant_id in (None, r.tenant_id)
        )

    def page_after(
        self, last_id: str, size: int, tenant_id: str | None = None
    ) -> list[tuple[Chunk, Document]]:
        rows = sorted(
            (r for r in self.rows.values() if r.id > last_id and tenant_id in (None, r.tenant_id)),
            key=lambda r: r.id,
        )[:size]
        return [(r.as_chunk(), self._document(r)) for r in rows]

    # -- helpers

    def _document(self, row: _Row) -> Document:
        live = self.documents[row.document_id]
        return Document(id=row.document_id, tenant_id=row.tenant_id, external_id=live.external_id)

    def _of_tenant(self, tenant_id: str) -> list[_Row]:
        return [r for r in self.rows.values() if r.tenant_id == tenant_id]

    def _among(self, tenant_id: str, ids: Sequence[str]) -> list[_Row]:
        rows = (self.rows.get(cid) for cid in ids)
        return [r for r in rows if r is not None and r.tenant_id == tenant_id]

    def _is_live(self, row: _Row) -> bool:
        live = self.documents.get(row.document_id)
        return live is not None and live.version == row.version

    def _has_second(self, row: _Row) -> bool:
        second = self.rows.get(f"{row.document_id}:1")
        return second is not None and second.version == row.version


def replace_fields(row: _Row, **extra: Any) -> Any:
    """A hydrated row: the chunk's columns and the joined ones, read by attribute name."""
    return _Hydrated(**{**vars(row), **extra})


class _Hydrated:
    def __init__(self, **columns: Any) -> None:
        self.__dict__.update(columns)


def _unit(vector: Sequence[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    return v / (np.linalg.norm(v) or 1.0)


def _bucket_sums(rows: Iterable[tuple[str, int, int]]) -> BucketStats:
    stats: dict[int, tuple[int, int, int]] = {}
    for chunk_id, version, print_ in rows:
        n, v, h = stats.get(bucket_of(chunk_id), (0, 0, 0))
        stats[bucket_of(chunk_id)] = (n + 1, v + version, h + print_)
    return stats


# ------------------------------------------------------------------ the chunk index


@dataclass
class _Copy:
    source: dict[str, Any]
    es_version: int
    index_tenant: str


class MemoryChunkIndex:
    """Each tenant's copies (their Elasticsearch documents), with external versions and the
    tombstones deletes leave, and a BM25 arm over their pre-analyzed fields."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or get_settings()
        # the search's defaults, as the real index reads them from the settings
        self.field_boosts = dict(settings.lexical_field_boosts)
        self.tie_breaker = settings.lexical_tie_breaker
        self.copies: dict[tuple[str, str], _Copy] = {}  # (index tenant, chunk id)
        self.tombstones: dict[tuple[str, str], int] = {}
        self._generations = itertools.count(1)
        self._building: tuple[str, str | None, dict[tuple[str, str], _Copy]] | None = None

    # -- writes

    def bulk(self, requests: Sequence[TenantLines]) -> Any:
        return self._bulk_into(self.copies, requests)

    def bulk_to(self, generation: str, requests: Sequence[TenantLines]) -> Any:
        return self._bulk_into(self._generation(generation), requests)

    def _bulk_into(
        self, target: dict[tuple[str, str], _Copy], requests: Sequence[TenantLines]
    ) -> dict[str, Any]:
        """Elasticsearch's bulk answer: an item per action, ``errors`` when one failed."""
        items = [item for tenant, lines in requests for item in self._apply(target, tenant, lines)]
        failed = any(
            i[op]["status"] >= 300 and (op, i[op]["status"]) != ("delete", 404)
            for i in items
            for op in i
        )
        return {"errors": failed, "items": items}

    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]:
        statuses = []
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
            [item] = self._apply(
                self.copies, chunk.tenant_id, [{"index": action}, es_document(chunk, doc)]
            )
            statuses.append(int(item["index"]["status"]))
        return statuses

    def prepare(self, tenant_ids: Iterable[str]) -> dict[str, IndexUnavailable]:
        return {}  # every tenant's "index" exists: a dictionary key

    def forget(self, tenant_id: str) -> None:
        return None  # nothing cached to check again

    def reindex_target(self) -> str | None:
        return None if self._building is None else self._building[0]

    def exists(self, tenant_id: str, chunk_id: str) -> bool:
        return (tenant_id, chunk_id) in self.copies

    def _apply(
        self, target: dict[tuple[str, str], _Copy], tenant_id: str, lines: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Bulk lines as Elasticsearch applies them with external versions: a write or delete
        at a version not above the copy's (or its tombstone's) is refused with 409
        (``external_gte``: not below it)."""
        items: list[dict[str, Any]] = []
        lines_left = iter(lines)
        for line in lines_left:
            [(op, action)] = line.items()
            key = (tenant_id, str(action["_id"]))
            version = int(action.get("version", 0))
            gte = action.get("version_type") == "external_gte"
            held = target.get(key)
            current = held.es_version if held is not None else self.tombstones.get(key)
            allowed = current is None or version > current or (gte and version >= current)
            if op == "index":
                source = next(lines_left)
                if not allowed:
                    items.append({"index": {"_id": key[1], "status": 409}})
                    continue
                target[key] = _Copy(dict(source), version, tenant_id)
                items.append({"index": {"_id": key[1], "status": 201 if held is None else 200}})
            else:  # delete
                if held is None:
                    self.tombstones[key] = max(version, current or 0)
                    items.append({"delete": {"_id": key[1], "status": 404}})
                elif not allowed:
                    items.append({"delete": {"_id": key[1], "status": 409}})
                else:
                    del target[key]
                    self.tombstones[key] = version
                    items.append({"delete": {"_id": key[1], "status": 200}})
        return items

    # -- the BM25 arm

    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]:
        terms = english_analysis.analyze(text).split()
        if not terms:
            return []
        boosts = {str(k): v for k, v in (field_boosts or self.field_boosts).items()}
        tie = self.tie_breaker if tie_breaker is None else tie_breaker
        copies = self._of_tenant(tenant_id)
        fields = {name: [c.source["stemmed"][name].split() for c in copies] for name in boosts}
        per_field = {name: _bm25(terms, docs) for name, docs in fields.items()}
        hits = []
        for i, copy in enumerate(copies):
            scores = [boosts[name] * per_field[name][i] for name in boosts]
            best = max(scores)
            if best <= 0 or not passes(
                filters, copy.source["metadata"], copy.source["document_id"]
            ):
                continue
            hits.append((copy.source["chunk_id"], best + tie * (sum(scores) - best)))
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))[:size]

    def term_counts(self, tenant_id: str, terms: list[str]) -> tuple[int, dict[str, int]] | None:
        copies = self._of_tenant(tenant_id)
        held = [
            {t for name in self.field_boosts for t in c.source["stemmed"][name].split()}
            for c in copies
        ]
        return len(copies), {term: sum(1 for words in held if term in words) for term in terms}

    # -- audit

    def refresh(self, tenant_id: str | None = None) -> None:
        return None  # every write is visible at once

    def tenants(self) -> set[str]:
        return {tenant for tenant, _ in self.copies}

    def count_of_tenant(self, tenant_id: str | None, /) -> int:
        return sum(1 for tenant, _ in self.copies if tenant_id in (None, tenant))

    def count_of_document(
        self, tenant_id: str, document_id: str, version: int | None = None
    ) -> int:
        return sum(
            1
            for c in self._of_tenant(tenant_id)
            if c.source["document_id"] == document_id
            and version in (None, int(c.source["version"]))
        )

    def cluster_status(self, timeout_s: float) -> str:
        return "green"

    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]:
        copies = self._of_tenant(tenant)
        sums = _bucket_sums(
            (c.source["chunk_id"], int(c.source["version"]), int(c.source["fingerprint"]))
            for c in copies
        )
        return sums, 0

    def fingerprints_in_buckets(self, tenant: str, buckets: list[int], /) -> Fingerprints:
        return {
            cid: (copy.version, copy.stored_fingerprint)
            for cid, copy in self.copies_in_buckets(tenant, buckets).items()
        }

    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]:
        wanted = set(buckets)
        return {
            c.source["chunk_id"]: _es_copy(c)
            for c in self._of_tenant(tenant)
            if not unbucketed and bucket_of(c.source["chunk_id"]) in wanted
        }

    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]:
        wanted = set(ids)
        return {cid: _es_copy(c) for (_, cid), c in self.copies.items() if cid in wanted}

    def foreign_copies(self, tenant: str) -> dict[str, EsCopy]:
        return {
            c.source["chunk_id"]: _es_copy(c)
            for c in self._of_tenant(tenant)
            if c.source["tenant_id"] != tenant
        }

    # -- reindex: the next generation of copies, built beside the live ones, then switched

    def per_tenant(self) -> bool:
        return True

    def start_reindex(self, tenant_id: str | None = None) -> ReindexStart:
        if self._building is not None:
            generation, scope, copies = self._building
            if scope != tenant_id:
                raise Conflict(f"a reindex of {scope or 'every tenant'} is under way")
            last = max((cid for _, cid in copies), default="")
            return ReindexStart(generation, last, resumed=True)
        generation = f"g{next(self._generations)}"
        self._building = (generation, tenant_id, {})
        return ReindexStart(generation, "", resumed=False)

    def copy_to(self, generation: str, chunks: Iterable[tuple[Chunk, Document]]) -> None:
        target = self._generation(generation)
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": "external_gte"}
            self._apply(target, chunk.tenant_id, [{"index": action}, es_document(chunk, doc)])

    def mark_reindex_progress(self, generation: str, last_id: str) -> None:
        self._generation(generation)  # progress is what the generation holds

    def finish_reindex(self, generation: str) -> list[str]:
        _, scope, built = self._building or ("", None, {})
        self._generation(generation)
        kept = {k: c for k, c in self.copies.items() if scope is not None and k[0] != scope}
        self.copies = {**kept, **built}
        self._building = None
        return [f"before-{generation}"]

    def _generation(self, generation: str) -> dict[tuple[str, str], _Copy]:
        if self._building is None or self._building[0] != generation:
            raise Conflict(f"no reindex is building generation {generation}")
        return self._building[2]

    def _of_tenant(self, tenant_id: str) -> list[_Copy]:
        return [c for (tenant, _), c in sorted(self.copies.items()) if tenant == tenant_id]


def _es_copy(copy: _Copy) -> EsCopy:
    source = copy.source
    return EsCopy(
        tenant_id=source.get("tenant_id", ""),
        version=int(source.get("version", 0)),
        stored_fingerprint=int(source.get("fingerprint", -1)),
        fields_fingerprint=fingerprint_of_source(source["chunk_id"], source),
        es_version=copy.es_version,
        index_tenant=copy.index_tenant,
    )


def _bm25(terms: list[str], docs: list[list[str]]) -> list[float]:
    """Each document's BM25 score for ``terms`` (a term asked twice counts twice), with
    Elasticsearch's idf and length normalization over these documents."""
    if not docs:
        return []
    average = sum(len(d) for d in docs) / len(docs) or 1.0
    counts = [Counter(d) for d in docs]
    held = Counter(t for c in counts for t in c)
    scores = []
    for words, tf in zip(docs, counts, strict=True):
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(words) / average)
        score = 0.0
        for term in terms:
            if tf[term]:
                idf = math.log(1 + (len(docs) - held[term] + 0.5) / (held[term] + 0.5))
                score += idf * tf[term] * (BM25_K1 + 1) / (tf[term] + norm)
        scores.append(score)
    return scores


if TYPE_CHECKING:  # mypy proves both implement every port of their real counterparts
    _vectors: VectorStore = MemoryVectorStore()
    _index: ChunkIndex = MemoryChunkIndex()
