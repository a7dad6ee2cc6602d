"""Where a tenant's chunks live in Postgres: the shared partition, or one of its own.

``chunks`` is partitioned by LIST (tenant_id) (migration 0013). Small tenants share the
DEFAULT partition ``chunks_shared``, which has no HNSW index: their dense search is an exact
scan of their own rows through the tenant index, which at that size is faster than any graph,
and their ingest pays for no graph inserts. A tenant with at least
``tenant_partition_min_chunks`` chunks gets a partition of its own with an HNSW graph of its
vectors alone, so its walk never visits another tenant's vectors and its exact scans stay in
its own pages. Placement runs periodically (the beat's ``place-tenant-partitions``) and from
``concord partitions place``.

A move happens when a tenant first crosses the threshold, so it moves a few thousand rows: it
holds writes (of every tenant) for about as long as it takes to copy them, and reads of the
shared partition for the ATTACH's check. The graph is built afterwards, CONCURRENTLY; until
it is valid the tenant's dense search is an exact scan of its partition (same results, slower).
A tenant never moves back; a tenant larger than one Postgres is the README's scaling section.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.errors import NotFound
from shared.settings import Settings, get_settings
from shared.stores import repository as repo

log = logging.getLogger(__name__)

# Below Postgres's deadlock_timeout (1 s): a move waiting on a writer gives up first.
MOVE_LOCK_TIMEOUT_MS = 500
MOVE_ATTEMPTS = 3
# How long a graph build waits for transactions open before it to end (then the next run).
GRAPH_LOCK_TIMEOUT_MS = 10_000


def partition_name(tenant_id: str) -> str:
    """A tenant's own partition: a fixed-length name from its id (an identifier needs no
    quoting, and a 64-character tenant id would not fit Postgres's 63)."""
    return "chunks_t_" + hashlib.sha1(tenant_id.encode()).hexdigest()[:20]


@dataclass
class Placement:
    """What one placement run did."""

    moved: dict[str, int] = field(default_factory=dict)  # tenant -> rows moved
    graphs_built: list[str] = field(default_factory=list)  # tenants whose HNSW index was built
    # tenants whose move met a writer, or whose graph build a transaction held: next run
    busy: list[str] = field(default_factory=list)
    skipped: bool = False  # another run was under way

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def place_tenants(
    transactions: Transactions,
    settings: Settings | None = None,
    tenant_id: str | None = None,
    progress: Callable[[str], None] | None = None,
    wait_s: float = 0.0,
) -> Placement:
    """Give every tenant of at least ``tenant_partition_min_chunks`` chunks (or just
    ``tenant_id``, whatever its size) a partition of its own, and build the HNSW graph of
    every own partition that lacks a valid one. One run at a time: a run that finds another
    under way waits for it up to ``wait_s``, then returns (``skipped``)."""
    settings = settings or get_settings()
    placement = Placement()
    deadline = time.monotonic() + wait_s
    # The guard's connection is in autocommit: it holds the run's lock between statements
    # without holding a transaction open, and builds the graphs (CONCURRENTLY needs that).
    with transactions() as guard:
        while not repo.try_placement_lock(guard.session):
            if time.monotonic() >= deadline:
                placement.skipped = True
                return placement
            time.sleep(0.2)
        try:
            _place(transactions, guard.session, settings, tenant_id, placement, progress)
        finally:
            repo.placement_unlock(guard.session)
    return placement


def _place(
    transactions: Transactions,
    autocommit: Session,
    settings: Settings,
    tenant_id: str | None,
    placement: Placement,
    progress: Callable[[str], None] | None,
) -> None:
    if tenant_id is not None:
        if not repo.tenant_exists(autocommit, tenant_id):
            # A typo must not leave a partition behind for a tenant that does not exist.
            raise NotFound(f"no tenant {tenant_id!r}")
        own = repo.own_partitions(autocommit)
        to_move = [] if tenant_id in own else [tenant_id]
    else:
        sizes = repo.shared_partition_sizes(autocommit, settings.tenant_partition_min_chunks)
        to_move = [tenant for tenant, _ in sizes]
    for tenant in to_move:
        moved = _move(transactions, tenant)
        if moved is None:
            placement.busy.append(tenant)
            continue
        placement.moved[tenant] = moved
        if progress:
            progress(f"{tenant}: {moved} chunks moved to {partition_name(tenant)}")
    for tenant, (partition, has_graph) in sorted(repo.own_partitions(autocommit).items()):
        if has_graph or (tenant_id is not None and tenant != tenant_id):
            continue
        started = time.monotonic()
        try:
            repo.build_hnsw_graph(
                autocommit, partition, GRAPH_LOCK_TIMEOUT_MS, settings.pg_graph_build_memory
            )
        except OperationalError as e:  # a transaction open longer than the timeout
            log.warning("HNSW graph of tenant %s not built, next run: %s", tenant, e.orig)
            placement.busy.append(tenant)
            continue
        placement.graphs_built.append(tenant)
        took = time.monotonic() - started
        log.info("HNSW graph of tenant %s built in %.1f s", tenant, took)
        if progress:
            progress(f"{tenant}: HNSW graph built in {took:.1f} s")


def _move(transactions: Transactions, tenant_id: str) -> int | None:
    """The rows moved, or None when every attempt met a lock (writes in flight)."""
    for attempt in range(1, MOVE_ATTEMPTS + 1):
        try:
            with transactions() as uow:
                moved = repo.move_to_own_partition(
                    uow.session, tenant_id, partition_name(tenant_id), MOVE_LOCK_TIMEOUT_MS
                )
            log.info("tenant %s: %d chunks moved to a partition of its own", tenant_id, moved)
            return moved
        except OperationalError as e:  # lock_timeout (55P03) or a deadlock (40P01)
            log.info("moving tenant %s: attempt %d met a lock: %s", tenant_id, attempt, e.orig)
            time.sleep(0.2 * attempt)
    return None


@dataclass(frozen=True)
class PartitionView:
    tenant_id: str | None  # None: the shared partition
    partition: str
    chunks: int
    graph: str  # "hnsw": a valid graph; "none": exact scans (the shared one, or being built)


def describe(transactions: Transactions) -> list[PartitionView]:
    """Every partition of ``chunks``: the shared one first, then each tenant's own."""
    with transactions() as uow:
        own = repo.own_partitions(uow.session)
        rows = repo.rows_per_partition(uow.session)
    views = [PartitionView(None, repo.SHARED_PARTITION, rows.get(repo.SHARED_PARTITION, 0), "none")]
    for tenant, (partition, has_graph) in sorted(own.items()):
        views.append(
            PartitionView(
                tenant, partition, rows.get(partition, 0), "hnsw" if has_graph else "none"
            )
        )
    return views
