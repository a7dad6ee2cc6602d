"""The stores a process works with, as one value its composition root builds once and passes
down: the API app (services/api/app.py), the worker (workers/celery_app.py), the CLI
(services/cli/main.py) and the offline applications (evaluation/, training/) call
:func:`connect`; every service and stage below them receives the ports it uses (a ``Stores``,
or one store bound to its transaction) and constructs none itself. A unit test passes the
in-memory stores (shared/stores/memory/) the same way.

    root ──connect(settings)──▶ Stores(index, vectors, snapshots, queue, embeddings)
                                  │      │        │         │      └─ embeddings(transactions):
                                  │      │        │         │         the embedding cache
                                  │      │        │         │         (Postgres)
                                  │      │        │         └─ queue: the task queue
                                  │      │        │            (Celery on Redis)
                                  │      │        └─ snapshots: a paginated search's kept
                                  │      │           rankings (Redis)
                                  │      └─ vectors(session): the vector store in that
                                  │         transaction (pgvector commits with the truth)
                                  └─ index: the chunk index (Elasticsearch), process-wide
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.queue import CeleryQueue, TaskQueue
from shared.settings import Settings, get_settings
from shared.stores.chunk_index import ChunkIndex, ElasticsearchChunkIndex
from shared.stores.embedding_cache import PgCachedEmbeddings
from shared.stores.ports import CachedEmbeddings, SnapshotStore
from shared.stores.snapshots import RedisSnapshots
from shared.stores.vector_store import PgVectorStore, VectorStore

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from shared.db import Transactions


@dataclass(frozen=True)
class Stores:
    """The chunk index, the vector store bound to a given transaction, the snapshots, and
    the task queue services publish their work to, and the embedding cache the ingest
    pipeline reads and fills, each read or write in a transaction of its own."""

    index: ChunkIndex
    vectors: Callable[[Session], VectorStore]
    snapshots: SnapshotStore
    queue: TaskQueue
    embeddings: Callable[[Transactions], CachedEmbeddings]


def connect(settings: Settings | None = None) -> Stores:
    """The real stores, configured by ``settings``: Elasticsearch (its client made on first
    use), pgvector in each caller's Postgres transaction, Redis, Celery's queues on Redis."""
    settings = settings or get_settings()

    def vectors(session: Session) -> VectorStore:
        return PgVectorStore(session, settings)

    return Stores(
        ElasticsearchChunkIndex(settings=settings),
        vectors,
        RedisSnapshots(settings),
        CeleryQueue(settings),
        PgCachedEmbeddings,
    )
