"""The stores' ports: what each audience needs of a store, as a protocol of its own.

Each consumer takes the narrowest port it uses, so an adapter can be replaced (or faked in a
unit test) for that audience alone, and a reader sees at the signature what a module may do
to a store:

* the relay writes copies: ``ChunkWriter``;
* the search's lexical arm: ``LexicalSearch``; its dense arm and hydration: ``VectorSearch``;
* the ingest pipeline and deletes write vectors: ``VectorWriter``;
* reconciliation reads what both stores share, ``ChunkAudit`` (tenants, counts, bucket
  fingerprints), and each store's own detail: ``IndexAudit`` (copies), ``VectorAudit`` (live
  chunks and their owners);
* reindex reads Postgres page by page (``ReindexSource``) into the next generation of indices
  (``IndexReindex``);
* operators' views: ``IndexHealth``, ``VectorReads``;
* the calibration of a tenant's decision threshold draws questions from its chunks:
  ``CorpusSample``;
* a paginated search keeps its ranking for the next pages: ``SnapshotStore`` (Redis);
* the ingest pipeline's embed step caches what it encodes: ``CachedEmbeddings`` (Postgres).

``ElasticsearchChunkIndex`` implements every ``Index*`` port and ``ChunkWriter`` and
``LexicalSearch``; ``PgVectorStore`` every ``Vector*`` port and ``ReindexSource``; both
implement ``ChunkAudit``; ``PgCachedEmbeddings`` is the cache. Every method raises Concord's
store errors (shared/errors.StoreError) for a store that fails, never its driver's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from shared.models import Chunk, Document
    from shared.stores.filters import Filters
    from shared.stores.schemas import (
        BucketStats,
        EsCopy,
        Fingerprints,
        IndexUnavailable,
        ReindexStart,
        TenantLines,
        VersionChunks,
    )


class ChunkAudit(Protocol):
    """What both stores report of what they hold, for reconciliation to compare."""

    def tenants(self) -> set[str]: ...
    def count_of_tenant(self, tenant_id: str | None, /) -> int: ...
    def fingerprints_in_buckets(self, tenant: str, buckets: list[int], /) -> Fingerprints: ...


# -- Elasticsearch's audiences


class ChunkWriter(Protocol):
    """The relay's: versioned bulk writes, each tenant's index made at its first write, the
    same lines to a reindex in progress."""

    def bulk(self, requests: Sequence[TenantLines]) -> Any: ...
    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]: ...
    def prepare(self, tenant_ids: Iterable[str]) -> dict[str, IndexUnavailable]: ...
    def forget(self, tenant_id: str) -> None: ...
    def reindex_target(self) -> str | None: ...
    def bulk_to(self, generation: str, requests: Sequence[TenantLines]) -> Any: ...
    def exists(self, tenant_id: str, chunk_id: str) -> bool: ...


class LexicalSearch(Protocol):
    """The search's lexical arm: BM25 within one tenant, and its term statistics."""

    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]: ...
    def term_counts(
        self, tenant_id: str, terms: list[str]
    ) -> tuple[int, dict[str, int]] | None: ...


class IndexAudit(ChunkAudit, Protocol):
    """Reconciliation's reads of the index: per-bucket sums and the copies themselves."""

    def refresh(self, tenant_id: str | None = None) -> None: ...
    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]: ...
    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]: ...
    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]: ...
    def foreign_copies(self, tenant: str) -> dict[str, EsCopy]: ...


class IndexReindex(Protocol):
    """Reindex: the next generation of indices (every tenant's, or one tenant's index) built
    beside the live one, then switched."""

    def per_tenant(self) -> bool: ...
    def start_reindex(self, tenant_id: str | None = None) -> ReindexStart: ...
    def copy_to(self, generation: str, chunks: Iterable[tuple[Chunk, Document]]) -> None: ...
    def mark_reindex_progress(self, generation: str, last_id: str) -> None: ...
    def finish_reindex(self, generation: str) -> list[str]: ...


class IndexHealth(Protocol):
    """What readiness and the document view ask of the index."""

    def cluster_status(self, timeout_s: float) -> str: ...
    def count_of_document(
        self, tenant_id: str, document_id: str, version: int | None = None
    ) -> int: ...


# -- Postgres/pgvector's audiences


class VectorWriter(Protocol):
    """The ingest pipeline's and deletes' writes of chunks and vectors."""

    def upsert(self, versions: Sequence[VersionChunks]) -> None: ...
    def delete_superseded(
        self, live_versions: dict[uuid.UUID, int], chunk_counts: dict[uuid.UUID, int] | None = None
    ) -> dict[uuid.UUID, list[str]]: ...


class CachedEmbeddings(Protocol):
    """The embed step's cache: vectors by model and a hash of exactly the text encoded."""

    def cached(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]: ...
    def keep(self, model: str, vectors: Mapping[str, np.ndarray]) -> None: ...


class VectorSearch(Protocol):
    """The search's dense arm, hydration and what ranking reads of the hits."""

    def nearest(
        self,
        tenant_id: str,
        vector: list[float],
        size: int,
        filters: Filters | None = None,
        *,
        within_s: float | None = None,
    ) -> list[tuple[str, float]]: ...
    def hydrate(
        self,
        tenant_id: str,
        ids: Sequence[str],
        vector: list[float] | None,
        embeddings_for: Sequence[str] = (),
    ) -> dict[str, Any]: ...
    def embeddings(self, tenant_id: str, ids: Sequence[str]) -> dict[str, np.ndarray]: ...
    def metadata_values(self, tenant_id: str, ids: Sequence[str], key: str) -> dict[str, Any]: ...


class VectorAudit(ChunkAudit, Protocol):
    """Reconciliation's reads of Postgres, the source of truth."""

    def bucket_stats(self, tenant_id: str) -> BucketStats: ...
    def fingerprints_by_ids(self, tenant_id: str, ids: Sequence[str]) -> Fingerprints: ...
    def owners(self, ids: Sequence[str]) -> dict[str, str]: ...
    def chunks_by_ids(self, ids: Sequence[str]) -> dict[str, Chunk]: ...


class ReindexSource(Protocol):
    """Reindex's reads of Postgres: every live chunk (or one tenant's), in id order, a page
    at a time."""

    def count_of_tenant(self, tenant_id: str | None, /) -> int: ...
    def count_up_to(self, last_id: str, tenant_id: str | None = None) -> int: ...
    def page_after(
        self, last_id: str, size: int, tenant_id: str | None = None
    ) -> list[tuple[Chunk, Document]]: ...


class CorpusSample(Protocol):
    """Chunk texts drawn at random from one tenant's corpus, and every corpus's size."""

    def counts_by_tenant(self) -> dict[str, int]: ...
    def sample_texts(self, tenant_id: str, size: int, seed: float = 0.0) -> list[str]: ...


class VectorReads(Protocol):
    """The document view's reads."""

    def chunks_by_ids(self, ids: Sequence[str]) -> dict[str, Chunk]: ...
    def document_chunks(
        self, tenant_id: str, document_id: uuid.UUID, section: str | None = None
    ) -> Sequence[Chunk]: ...
    def count_of_document(self, document_id: uuid.UUID) -> int: ...


# -- Redis's


class SnapshotStore(Protocol):
    """Short-lived snapshots under random ids, a bounded number per tenant (the paginated
    search's cursors): gone after their time to live, or once the tenant keeps too many."""

    def put(self, tenant_id: str, snapshot_id: str, blob: bytes) -> None: ...
    def get(self, snapshot_id: str) -> bytes | None: ...
