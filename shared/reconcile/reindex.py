"""Rebuild the Elasticsearch index from Postgres behind the alias, then switch atomically.

1. A new generation is marked (its anchor index gets the ``<alias>-reindexing`` alias); from
   then on the relay writes every change to it as well as to the live indices (dual write).
   The anchor is made under the settings of the process that starts the reindex, and every
   index of the generation is made as the anchor is (shards, replicas, lexical analysis),
   whichever process makes it: a relay configured otherwise does not mix the generation.
2. Chunks are copied from Postgres in id order, a page at a time, into their tenants' indices
   of the new generation, with external versions (a newer dual-written copy wins). After each
   page the last id copied is stored in the anchor's ``_meta``, so an interrupted reindex
   resumes where it stopped; unless the settings of its shape changed meanwhile: then the
   generation is discarded and the reindex starts again from the first chunk.
3. The read alias and every tenant's alias move to the new generation in one
   ``update_aliases`` call; the old indices are deleted. Searches use the live aliases
   throughout and never see a half-built index.

``tenant_id`` rebuilds one tenant's index the same way (a generation of that index alone,
only its chunks copied, only its changes dual-written, only its aliases switched): after an
incident in one tenant's index, or to give one tenant new shards, without copying every other
tenant's chunks. It needs the per-tenant layout; an interrupted reindex of other tenants is
finished first (shared/stores/chunk_index/reindex.py, ``start_reindex``).

The same run moves a deployment from the shared layout (one index for every tenant) to an
index per tenant (shared/stores/es_index.py), online and resumable.

Both stores are reached through their ports (shared/stores/ports.py: ``ReindexSource`` pages,
``IndexReindex`` copies), each page read in a transaction of its own from the boundary's
``transactions``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.db.repository import run_unlock, try_run_lock
from shared.errors import Conflict
from shared.stores.compose import Stores
from shared.stores.ports import IndexReindex, ReindexSource

PAGE = 1000

# pg_try_advisory_lock's key for reindex runs (any fixed bigint: "concrndx" in ASCII).
_REINDEX_LOCK = 0x636F6E63726E6478


class ReindexRunning(Conflict):
    """Another reindex is under way, from any host. Two at once could each switch to, or
    discard, the generation the other one builds."""


@dataclass
class ReindexResult:
    old_indices: list[str]
    new_index: str  # the generation switched to
    copied: int
    resumed: bool
    seconds: float
    # Why a reindex in progress was discarded and this one started from the first chunk.
    started_again_because: str | None = None


def reindex(
    stores: Stores,
    transactions: Transactions,
    progress: Callable[[int, int], None] | None = None,
    *,
    page_size: int = PAGE,
    notice: Callable[[str], None] | None = None,
    tenant_id: str | None = None,
) -> ReindexResult:
    """One run at a time (ReindexRunning otherwise), of every tenant or of ``tenant_id``;
    ``notice`` hears at the start why a generation in progress was discarded, where one
    was."""
    # The guard's connection is in autocommit: it holds the lock between statements without
    # holding a transaction open, and a run that dies releases it with its connection.
    with transactions() as guard:
        if not try_run_lock(guard.session, _REINDEX_LOCK):
            raise ReindexRunning(
                "another reindex is under way; run this again once it has ended (a reindex "
                "whose process died has ended: this one resumes it)"
            )
        try:
            return _reindex(
                stores.index,
                stores.vectors,
                transactions,
                progress,
                page_size=page_size,
                notice=notice,
                tenant_id=tenant_id,
            )
        finally:
            run_unlock(guard.session, _REINDEX_LOCK)


def _reindex(
    index: IndexReindex,
    source: Callable[[Session], ReindexSource],
    transactions: Transactions,
    progress: Callable[[int, int], None] | None,
    *,
    page_size: int,
    notice: Callable[[str], None] | None,
    tenant_id: str | None,
) -> ReindexResult:
    started = time.monotonic()
    start = index.start_reindex(tenant_id)
    if start.started_again_because and notice:
        notice(f"started again: {start.started_again_because}")
    target, last_id = start.generation, start.last_id  # target: the generation built
    with transactions() as uow:
        store = source(uow.session)
        total = store.count_of_tenant(tenant_id)
        done = store.count_up_to(last_id, tenant_id) if last_id else 0
    while True:
        with transactions() as uow:
            store = source(uow.session)
            page = store.page_after(last_id, page_size, tenant_id)
        if not page:
            break
        index.copy_to(target, page)
        last_id = page[-1][0].id
        index.mark_reindex_progress(target, last_id)
        done += len(page)
        if progress:
            progress(done, total)
    old = index.finish_reindex(target)
    return ReindexResult(
        old, target, done, start.resumed, time.monotonic() - started, start.started_again_because
    )
