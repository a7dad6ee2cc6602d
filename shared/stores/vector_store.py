"""The vector store (pgvector, in the same Postgres as the truth), as the rest of Concord uses
it:

* writes, in the caller's transaction (so the dense index commits with the truth): versioned
  upserts, where an older version never replaces a newer one, and removal of the chunks a
  newer version or a tombstone superseded;
* dense search within one tenant: an exact scan for a tenant in the shared partition, a walk
  of its own HNSW graph (iterative scan) for one with a partition of its own
  (shared/stores/partitions.py), with the request's filters inside the scan;
* hydration: the live chunks among a list of ids, with provenance and their cosine to the
  query, and embeddings for the few that need them;
* reads for reconciliation and reindex: tenants, per-bucket sums, fingerprints, pages of
  chunks in id order.

``PgVectorStore`` is bound to a session, the caller's unit of work; every statement it runs
is in shared/stores/repository.py, and its methods raise Concord's store errors
(shared/stores/driver_errors.postgres_error), never SQLAlchemy's. The contract it shares
with the chunk index (shared/stores/chunk_index/) is tested once for both in
tests/contract/test_stores.py, and for their in-memory twins (shared/stores/memory/) in
tests/unit/stores."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.db import repository as db_repo
from shared.models import Chunk, Document
from shared.settings import Settings, get_settings
from shared.stores import repository as repo
from shared.stores.driver_errors import raises_postgres_errors
from shared.stores.filters import Filters, sql_conditions
from shared.stores.partitions import partition_name
from shared.stores.ports import (
    CorpusSample,
    ReindexSource,
    VectorAudit,
    VectorReads,
    VectorSearch,
    VectorWriter,
)
from shared.stores.schemas import BucketStats, Fingerprints, VersionChunks

# tenant -> (checked at, has a partition of its own with a valid graph). Only speed depends
# on it: a search of either kind finds the tenant's rows wherever they are.
_own_graph: dict[str, tuple[float, bool]] = {}
PARTITION_CHECK_TTL_S = 30.0


class VectorStore(
    VectorWriter, VectorSearch, VectorAudit, ReindexSource, VectorReads, CorpusSample, Protocol
):
    """Every port of the vector store (shared/stores/ports.py); PgVectorStore is the one there
    is. Consumers take the narrowest port they use."""


# A search's time left for its dense arm this close to its whole limit is taken for all of it.
SLOT_WAIT_SLACK_S = 0.05


@raises_postgres_errors  # Concord's store errors, never SQLAlchemy's or psycopg's
class PgVectorStore:
    def __init__(self, session: Session, settings: Settings | None = None) -> None:
        self.session = session
        self.settings = settings or get_settings()

    # -- writes (in the caller's transaction)

    def upsert(self, versions: Sequence[VersionChunks]) -> None:
        """Write the chunks (with embeddings) of many document versions; an older version
        never overwrites a newer one. At most one entry per document."""
        repo.upsert_chunks(self.session, versions)

    def delete_superseded(
        self, live_versions: dict[uuid.UUID, int], chunk_counts: dict[uuid.UUID, int] | None = None
    ) -> dict[uuid.UUID, list[str]]:
        """Remove each document's chunks older than its live version (and, with
        ``chunk_counts``, those of that version past its count): document id -> ids."""
        return repo.delete_superseded_chunks(self.session, live_versions, chunk_counts)

    # -- search and hydration (one tenant)

    def nearest(
        self,
        tenant_id: str,
        vector: list[float],
        size: int,
        filters: Filters | None = None,
        *,
        within_s: float | None = None,
    ) -> list[tuple[str, float]]:
        """(chunk id, cosine similarity), best first, among the tenant's chunks that pass
        ``filters``. A tenant in the shared partition is scanned exactly (it is small: there
        is no graph there, and at its size a scan is faster); one with a partition of its own
        walks that partition's HNSW graph (an exact scan while the graph is being built).

        With ``within_s`` (a search's): Postgres cancels the search past that many seconds,
        and it runs in a savepoint, rolled back after (a read writes nothing): a cancelled
        statement leaves the caller's transaction usable, and the caller's own statement
        limit is back in force after. A cancelled or failed search is StoreUnavailable."""
        if within_s is None:
            return self._nearest(tenant_id, vector, size, filters)
        savepoint = self.session.begin_nested()
        try:
            # A search's read transaction ends its statements after search_store_timeout_s
            # already (shared/search/service.py): a limit of its own only where a wait for a
            # dense slot took part of that time (a round trip to Postgres a search fewer).
            if within_s < self.settings.search_store_timeout_s - SLOT_WAIT_SLACK_S:
                db_repo.limit_statements(self.session, within_s)
            return self._nearest(tenant_id, vector, size, filters)
        finally:
            savepoint.rollback()

    def _nearest(
        self, tenant_id: str, vector: list[float], size: int, filters: Filters | None
    ) -> list[tuple[str, float]]:
        exact = not self._has_own_graph(tenant_id)
        rows = repo.nearest_chunks(
            self.session,
            tenant_id,
            vector,
            size,
            # One HNSW scan yields at most ef_search rows: never ask for more than it finds.
            max(self.settings.hnsw_ef_search, size),
            sql_conditions(filters) if filters is not None else (),
            exact=exact,
        )
        return [(cid, 1.0 - float(distance)) for cid, distance in rows]

    def hydrate(
        self,
        tenant_id: str,
        ids: Sequence[str],
        vector: list[float] | None,
        embeddings_for: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The live chunks among ``ids`` (document not deleted, chunk at its version), by id,
        with provenance and ``cosine`` to ``vector``; ``embedding`` bytes only for
        ``embeddings_for``. An id missing from the answer is not live: never serve it."""
        return repo.live_chunks(self.session, tenant_id, ids, vector, embeddings_for)

    def embeddings(self, tenant_id: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return repo.chunk_embeddings(self.session, tenant_id, ids)

    def metadata_values(self, tenant_id: str, ids: Sequence[str], key: str) -> dict[str, Any]:
        """Chunk id -> its metadata value under ``key``, for those among ``ids`` that have one
        (a search's boost reads them for its fused candidates)."""
        return repo.metadata_values(self.session, tenant_id, ids, key)

    def document_chunks(
        self, tenant_id: str, document_id: uuid.UUID, section: str | None = None
    ) -> Sequence[Chunk]:
        """Every chunk of the document's live version, in order (optionally one section)."""
        return repo.document_chunks(self.session, tenant_id, document_id, section)

    # -- reads by id and counts

    def chunks_by_ids(self, ids: Sequence[str]) -> dict[str, Chunk]:
        """The chunks that exist, whatever their tenant, without embeddings."""
        return repo.chunks_by_ids(self.session, ids)

    def count_of_tenant(self, tenant_id: str | None) -> int:
        """Chunks of one tenant (every tenant's when None)."""
        conditions = () if tenant_id is None else (Chunk.tenant_id == tenant_id,)
        return repo.count_chunks(self.session, *conditions)

    def count_of_document(self, document_id: uuid.UUID) -> int:
        return repo.count_chunks(self.session, Chunk.document_id == document_id)

    def counts_by_tenant(self) -> dict[str, int]:
        """Every tenant's number of chunks, in one scan."""
        return repo.chunk_counts_by_tenant(self.session)

    def sample_texts(self, tenant_id: str, size: int, seed: float = 0.0) -> list[str]:
        """``size`` of the tenant's chunk texts at random (the same ones for one ``seed``)."""
        return repo.sample_chunk_texts(self.session, tenant_id, size, seed)

    def _has_own_graph(self, tenant_id: str) -> bool:
        """Whether the tenant has a partition of its own with a valid HNSW graph; looked up
        again at most every 30 s per process."""
        checked_at, own = _own_graph.get(tenant_id, (0.0, False))
        if time.monotonic() - checked_at > PARTITION_CHECK_TTL_S:
            own = repo.has_own_graph(self.session, partition_name(tenant_id))
            _own_graph[tenant_id] = (time.monotonic(), own)
        return own

    # -- reconciliation

    def tenants(self) -> set[str]:
        return repo.tenants(self.session)

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        return repo.bucket_stats(self.session, tenant_id)

    def fingerprints_in_buckets(self, tenant_id: str, buckets: Sequence[int]) -> Fingerprints:
        if not buckets:
            return {}
        return repo.fingerprints(self.session, tenant_id, any_of(Chunk.bucket, buckets))

    def fingerprints_by_ids(self, tenant_id: str, ids: Sequence[str]) -> Fingerprints:
        if not ids:
            return {}
        return repo.fingerprints(self.session, tenant_id, any_of(Chunk.id, ids))

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        """chunk id -> tenant, for the ids Postgres holds."""
        return repo.chunk_tenants(self.session, ids)

    # -- reindex

    def count_up_to(self, last_id: str, tenant_id: str | None = None) -> int:
        """Chunks (every tenant's, or ``tenant_id``'s) whose id sorts at or before
        ``last_id``: what a resumed reindex has done."""
        of_tenant = [Chunk.tenant_id == tenant_id] if tenant_id is not None else []
        return repo.count_chunks(self.session, Chunk.id <= last_id, *of_tenant)

    def page_after(
        self, last_id: str, size: int, tenant_id: str | None = None
    ) -> list[tuple[Chunk, Document]]:
        """The next ``size`` chunks (every tenant's, or ``tenant_id``'s) in id order after
        ``last_id``, with their documents."""
        return repo.chunks_after(self.session, last_id, size, tenant_id)


if TYPE_CHECKING:  # mypy proves the adapter implements every port
    _implements: VectorStore = PgVectorStore(cast(Session, None))
