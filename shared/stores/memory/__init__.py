"""In-memory stores: the vector store, the chunk index, the embedding cache and the task
queue as Python objects, for unit tests of the stages above the stores (retrieval, fusion,
hydration, decision, paging, the ingest pipeline's steps) with no service running.

They keep the contract the real adapters keep, and prove it the same way: the parametrized
suite of tests/contract runs against both (``ChunkStoreContract``). What they share with the
real stores is code, not a copy of it: the BM25 arm analyzes text with the Python English
analysis the Elasticsearch copies are indexed with (shared/stores/english_analysis.py), the
copies are built by shared/stores/chunk_document.py, fingerprints and buckets by
shared/stores/buckets.py. Scores follow Elasticsearch's BM25 (k1 1.2, b 0.75, a best-fields
``multi_match`` with the same boosts and tie breaker) and pgvector's cosine.

A ``MemoryVectorStore`` stands for the vector store in every transaction (writes are seen at
once, nothing is rolled back), a ``MemoryCachedEmbeddings`` for the embedding cache in every
transaction likewise; a ``MemoryQueue`` keeps what is published for the test to read
(shared/stores/memory/queue.py); build them all with :func:`memory_stores`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.settings import Settings
from shared.stores.compose import Stores
from shared.stores.memory.embeddings import MemoryCachedEmbeddings
from shared.stores.memory.index import MemoryChunkIndex
from shared.stores.memory.queue import MemoryQueue
from shared.stores.memory.vectors import MemoryVectorStore

if TYPE_CHECKING:
    from shared.stores.chunk_index import ChunkIndex
    from shared.stores.vector_store import VectorStore

__all__ = [
    "MemoryCachedEmbeddings", "MemoryChunkIndex", "MemoryQueue", "MemorySnapshots",
    "MemoryVectorStore", "memory_stores",
]  # fmt: skip


def memory_stores(settings: Settings | None = None) -> Stores:
    """The stores and the queue in memory, as a composition root would pass the real ones."""
    vectors, embeddings = MemoryVectorStore(), MemoryCachedEmbeddings()
    return Stores(
        MemoryChunkIndex(settings),
        lambda _session: vectors,
        MemorySnapshots(),
        MemoryQueue(),
        lambda _transactions: embeddings,
    )


class MemorySnapshots:
    """Snapshots in a dictionary, kept until the process ends (no time to live, no cap)."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    def put(self, tenant_id: str, snapshot_id: str, blob: bytes) -> None:
        self.kept[snapshot_id] = blob

    def get(self, snapshot_id: str) -> bytes | None:
        return self.kept.get(snapshot_id)


if TYPE_CHECKING:  # mypy proves each implements every port of its real counterpart
    _vectors: VectorStore = MemoryVectorStore()
    _index: ChunkIndex = MemoryChunkIndex()
