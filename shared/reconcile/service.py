"""Reconciliation: prove that Elasticsearch holds exactly the live chunks of Postgres (the
source of truth), at their versions and fingerprints, and repair what differs.

Cost grows with the drift, not the corpus: per tenant, both stores report per-bucket
(count, sum of versions, sum of fingerprints); only buckets that differ are read chunk by
chunk. Drift is classified as

* ``missing``: live in Postgres, absent from Elasticsearch;
* ``stale``: in both, but the copy holds another version, or fields whose fingerprint differs
  (text, title, section, metadata...);
* ``orphaned``: in Elasticsearch but not live in Postgres (tombstoned or superseded);
* ``wrong_tenant``: in Elasticsearch under another tenant than Postgres says.

It works at any scale of drift: each tenant's differing buckets are read in ranges of about
``RANGE_CHUNKS`` chunks, one transaction per range, so neither memory nor a transaction grows
with the loss, and repairs queued for a range are kept even if a later range fails. A repair
after losing all of Elasticsearch is the same code reading every bucket.

Repairs go through the outbox, the same idempotent write path as ingestion: ``repair`` rows
re-send the Postgres chunk, ``purge`` rows delete, both with external versions that may
overwrite an equal version (a corrupted copy) but never a newer one. The relay re-checks each
delete against Postgres when it applies it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from shared.db import Transactions
from shared.db.repository import run_unlock, try_run_lock
from shared.outbox import repository as outbox_repo
from shared.reconcile import repository as repo
from shared.reconcile.drift import ReconcileReport, compare_range, purge_foreign
from shared.relay import service as relay
from shared.stores.buckets import BUCKETS
from shared.stores.compose import Stores

log = logging.getLogger(__name__)

# Chunks compared (and repairs queued) per transaction; a range holds whole buckets.
RANGE_CHUNKS = 20_000

# progress(tenant, buckets done, buckets to compare) after each range
Progress = Callable[[str, int, int], None]


def reconcile(
    stores: Stores,
    transactions: Transactions,
    tenant: str | None = None,
    *,
    repair: bool = False,
    deep: bool = False,
    progress: Progress | None = None,
) -> ReconcileReport:
    """Compare (and with ``repair``, queue repairs for) one tenant or every tenant, each
    range of buckets in a transaction of its own from ``transactions``.

    ``deep`` compares every bucket chunk by chunk instead of trusting agreeing bucket sums:
    it also finds a copy edited outside Concord whose stored fingerprint was left as it was.
    """
    index = stores.index
    started = time.monotonic()
    report = ReconcileReport()
    index.refresh(tenant)  # compare against every write acknowledged so far
    if tenant:
        tenants = [tenant]
    else:
        with transactions() as uow:
            tenants = sorted(stores.vectors(uow.session).tenants() | index.tenants())
    report.tenants = len(tenants)
    for t in tenants:
        _reconcile_tenant(
            transactions, stores, t, report, repair=repair, deep=deep, progress=progress
        )
    report.duration_s = time.monotonic() - started
    with transactions() as uow:
        repo.add_run(
            uow.session,
            tenant_id=tenant,
            duration_s=report.duration_s,
            repair=repair,
            report=report.as_dict(),
        )
    return report


# The periodic reconcile's run lock (see shared/db/repository.try_run_lock): "concrecn".
_PERIODIC_LOCK = 0x636F6E637265636E


def periodic_reconcile(stores: Stores, transactions: Transactions) -> dict[str, Any]:
    """Beat's repairing reconcile of every tenant, one run at a time: a run that outlasts the
    interval (a large corpus) is not joined by the next, which skips instead of comparing
    the same ranges beside it and taking another worker process."""
    with transactions() as guard:
        if not try_run_lock(guard.session, _PERIODIC_LOCK):
            return {"skipped": "the previous periodic reconcile is still running"}
        try:
            return reconcile(stores, transactions, repair=True).as_dict()
        finally:
            run_unlock(guard.session, _PERIODIC_LOCK)


def reconcile_and_verify(
    stores: Stores,
    transactions: Transactions,
    tenant: str | None = None,
    deep: bool = False,
    progress: Progress | None = None,
    wait_s: float = 30.0,
    waiting: RepairProgress | None = None,
) -> tuple[ReconcileReport, ReconcileReport]:
    """Repair, drain the outbox now (waiting up to ``wait_s`` for repairs Elasticsearch
    postpones), and compare again: the second report shows what remains."""
    first = reconcile(stores, transactions, tenant, repair=True, deep=deep, progress=progress)
    drained = first.repaired_ids | first.in_flight
    if drained:
        drain_repairs(stores, transactions, drained, wait_s, waiting)
        stores.index.refresh(tenant)
    after = reconcile(stores, transactions, tenant, repair=False)
    after.count_as_drift(drained)  # what the drain did not get applied still differs
    return first, after


# Called while repairs wait: (repairs still in the outbox, of how many, seconds waited).
RepairProgress = Callable[[int, int, float], None]


def drain_repairs(
    stores: Stores,
    transactions: Transactions,
    chunk_ids: set[str],
    wait_s: float = 30.0,
    waiting: RepairProgress | None = None,
) -> None:
    """Send the queued repairs and wait until they have left the outbox, or ``wait_s``.

    A running relay worker may have claimed some of them first (claims skip locked rows), so an
    empty drain here does not mean they were sent: wait for the other relay's transaction too.
    Rows postponed are waited for as well, and sent as they come due: a repair of a chunk
    deleted out of band meets Elasticsearch's tombstone of a newer version, which blocks it
    until Elasticsearch forgets the tombstone (``index.gc_deletes``, 60 s: the command
    reported drift and exited 1 while its repairs landed 20-30 s later). The outbox holds
    every tenant's rows, so draining it here (an admin's API request may be what runs this)
    stops at the deadline too; what is left then shows as drift in the second report.
    """
    started = time.monotonic()
    deadline = started + wait_s
    ids = sorted(chunk_ids)
    while True:
        relay.drain(stores, transactions, max_batches=10_000, deadline=deadline)
        with transactions() as uow:
            pending = outbox_repo.outbox_rows_for(uow.session, ids)
        if not pending or time.monotonic() >= deadline:
            return
        if waiting is not None:
            waiting(pending, len(ids), time.monotonic() - started)
        time.sleep(0.5)


def _bucket_ranges(buckets: list[int], sizes: dict[int, int]) -> Iterator[list[int]]:
    """Consecutive runs of ``buckets`` holding at most ``RANGE_CHUNKS`` chunks each (a bucket
    larger than that is a range of its own)."""
    max_chunks = RANGE_CHUNKS
    current: list[int] = []
    held = 0
    for bucket in buckets:
        if current and held + sizes.get(bucket, 0) > max_chunks:
            yield current
            current, held = [], 0
        current.append(bucket)
        held += sizes.get(bucket, 0)
    if current:
        yield current


def _reconcile_tenant(
    transactions: Transactions,
    stores: Stores,
    tenant: str,
    report: ReconcileReport,
    *,
    repair: bool,
    deep: bool,
    progress: Progress | None,
) -> None:
    index = stores.index
    with transactions() as uow:
        pg_stats = stores.vectors(uow.session).bucket_stats(tenant)
    es_stats, unbucketed = index.bucket_stats(tenant)
    report.buckets_scanned += BUCKETS
    differing = sorted(
        b for b in set(pg_stats) | set(es_stats) if pg_stats.get(b) != es_stats.get(b)
    )
    report.buckets_differing += len(differing)
    to_read = list(range(BUCKETS)) if deep else differing
    sizes = {b: max(pg_stats.get(b, (0, 0, 0))[0], es_stats.get(b, (0, 0, 0))[0]) for b in to_read}
    done = 0
    for buckets in _bucket_ranges(to_read, sizes):
        with transactions() as uow:
            vectors = stores.vectors(uow.session)
            pg_rows = vectors.fingerprints_in_buckets(tenant, buckets)
            es_rows = index.copies_in_buckets(tenant, buckets)
            compare_range(uow.session, vectors, index, tenant, pg_rows, es_rows, report, repair)
        done += len(buckets)
        if progress:
            progress(tenant, done, len(to_read))
        log.info("reconcile %s: %d of %d buckets compared", tenant, done, len(to_read))
    if unbucketed:  # legacy copies without a bucket: compare them with their Postgres rows
        with transactions() as uow:
            es_rows = index.copies_in_buckets(tenant, [], unbucketed=True)
            vectors = stores.vectors(uow.session)
            pg_rows = vectors.fingerprints_by_ids(tenant, sorted(es_rows))
            compare_range(uow.session, vectors, index, tenant, pg_rows, es_rows, report, repair)
    foreign = index.foreign_copies(tenant)
    if foreign:
        with transactions() as uow:
            purge_foreign(uow.session, stores.vectors(uow.session), tenant, foreign, report, repair)
