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
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.db.repository import run_unlock, try_run_lock
from shared.documents import repository as documents_repo
from shared.jobs import repository as jobs_repo
from shared.models import OutboxOp
from shared.outbox import repository as outbox_repo
from shared.reconcile import repository as repo
from shared.relay import service as relay
from shared.stores.buckets import BUCKETS
from shared.stores.compose import Stores
from shared.stores.ports import IndexAudit, VectorAudit
from shared.stores.schemas import EsCopy, Fingerprints, document_id_of

log = logging.getLogger(__name__)

CLASSES = ("missing", "stale", "orphaned", "wrong_tenant")
SAMPLE = 10
# Chunks compared (and repairs queued) per transaction; a range holds whole buckets.
RANGE_CHUNKS = 20_000
# Ids per Elasticsearch ids query and per Postgres array parameter.
ID_PAGE = 10_000

# progress(tenant, buckets done, buckets to compare) after each range
Progress = Callable[[str, int, int], None]


@dataclass
class ReconcileReport:
    tenants: int = 0
    buckets_scanned: int = 0
    buckets_differing: int = 0
    ids_read: int = 0
    drift: dict[str, set[str]] = field(default_factory=lambda: {c: set() for c in CLASSES})
    repaired_ids: set[str] = field(default_factory=set)  # chunks with a repair queued
    # Chunks whose stores differ while an outbox write for them is still waiting (an upload
    # the relay has not sent yet, or a repair queued earlier): writes in flight, not drift.
    # They are neither counted as drift nor repaired again.
    in_flight: set[str] = field(default_factory=set)
    in_flight_drift: dict[str, set[str]] = field(  # their class, were they not in flight
        default_factory=lambda: {c: set() for c in CLASSES}
    )
    # drifted chunks left alone because their last write is a dead letter an operator must
    # replay or discard first (concord dlq)
    repairs_held: set[str] = field(default_factory=set)
    unrepairable: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def repairs_queued(self) -> int:
        return len(self.repaired_ids)

    def total(self) -> int:
        return sum(len(ids) for ids in self.drift.values())

    def count_as_drift(self, chunk_ids: set[str]) -> None:
        """Count these chunks as drift although their writes are still in the outbox: after
        a repair was drained, a repair still waiting has not fixed anything (Elasticsearch
        down, a relay behind)."""
        for name, ids in self.in_flight_drift.items():
            self.drift[name] |= ids & chunk_ids
            ids -= chunk_ids
        self.in_flight -= chunk_ids

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenants": self.tenants,
            "buckets_scanned": self.buckets_scanned,
            "buckets_differing": self.buckets_differing,
            "ids_read": self.ids_read,
            "counts": {c: len(ids) for c, ids in self.drift.items()},
            "samples": {c: sorted(ids)[:SAMPLE] for c, ids in self.drift.items()},
            "total_drift": self.total(),
            "in_flight": len(self.in_flight),
            "in_flight_samples": sorted(self.in_flight)[:SAMPLE],
            "repairs_queued": self.repairs_queued,
            "repairs_held_by_dead_letters": sorted(self.repairs_held)[:SAMPLE],
            "unrepairable": self.unrepairable[:SAMPLE],
            "duration_s": round(self.duration_s, 3),
        }


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


@dataclass
class _RangeDrift:
    drift: dict[str, set[str]] = field(default_factory=lambda: {c: set() for c in CLASSES})
    orphan_copies: dict[str, EsCopy] = field(default_factory=dict)
    # copies of a chunk in another tenant's index than its own: deleted from there
    strays: dict[str, EsCopy] = field(default_factory=dict)
    unrepairable: set[str] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)  # each drifted chunk's newest version


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
            _compare_range(uow.session, vectors, index, tenant, pg_rows, es_rows, report, repair)
        done += len(buckets)
        if progress:
            progress(tenant, done, len(to_read))
        log.info("reconcile %s: %d of %d buckets compared", tenant, done, len(to_read))
    if unbucketed:  # legacy copies without a bucket: compare them with their Postgres rows
        with transactions() as uow:
            es_rows = index.copies_in_buckets(tenant, [], unbucketed=True)
            vectors = stores.vectors(uow.session)
            pg_rows = vectors.fingerprints_by_ids(tenant, sorted(es_rows))
            _compare_range(uow.session, vectors, index, tenant, pg_rows, es_rows, report, repair)
    foreign = index.foreign_copies(tenant)
    if foreign:
        with transactions() as uow:
            _purge_foreign(
                uow.session, stores.vectors(uow.session), tenant, foreign, report, repair
            )


def _purge_foreign(
    session: Session,
    vectors: VectorAudit,
    tenant: str,
    foreign: dict[str, EsCopy],
    report: ReconcileReport,
    repair: bool,
) -> None:
    """Copies in the tenant's own index that claim another tenant. One of the tenant's own
    chunks (its copy's tenant field edited) is found by the bucket sums and rewritten there;
    any other is another tenant's copy, or no one's, in the wrong index: deleted from it."""
    report.ids_read += len(foreign)
    owners = vectors.owners(sorted(foreign))
    strays = {cid: copy for cid, copy in foreign.items() if owners.get(cid) != tenant}
    waiting = outbox_repo.chunks_with_queued_writes(session, sorted(strays), tenant)
    report.in_flight |= waiting
    for cid in waiting:
        report.in_flight_drift["wrong_tenant" if owners.get(cid) else "orphaned"].add(cid)
    strays = {cid: copy for cid, copy in strays.items() if cid not in waiting}
    for cid in strays:  # another tenant's chunk, or nobody's
        report.drift["wrong_tenant" if owners.get(cid) else "orphaned"].add(cid)
    if not repair:
        return
    entries = [
        outbox_repo.OutboxEntry(tenant, document_id_of(cid), OutboxOp.PURGE, copy.es_version, [cid])
        for cid, copy in sorted(strays.items())
    ]
    outbox_repo.add_outbox_entries(session, entries)
    report.repaired_ids |= {cid for e in entries for cid in e.chunk_ids}


def _compare_range(
    session: Session,
    vectors: VectorAudit,
    index: IndexAudit,
    tenant: str,
    pg_rows: Fingerprints,
    es_rows: dict[str, EsCopy],
    report: ReconcileReport,
    repair: bool,
) -> None:
    """Classify the drift between one range's rows in both stores, setting apart the chunks
    with a write still waiting in the outbox (in flight); with ``repair``, queue the repairs
    in the caller's transaction."""
    found = _RangeDrift()
    report.ids_read += len(pg_rows) + len(es_rows)
    missing = [cid for cid in pg_rows if cid not in es_rows]
    elsewhere = index.copies_by_ids(missing, page=ID_PAGE)
    for cid in missing:
        copy = elsewhere.get(cid)
        in_another_index = copy is not None and copy.index_tenant not in (None, tenant)
        if copy is not None and (copy.tenant_id != tenant or in_another_index):
            found.drift["wrong_tenant"].add(cid)
            if in_another_index:
                found.strays[cid] = copy
        else:
            found.drift["missing"].add(cid)
    extra = [cid for cid in es_rows if cid not in pg_rows]
    owners = vectors.owners(extra)
    for cid in extra:
        owner = owners.get(cid)
        if owner and owner != tenant:
            found.drift["wrong_tenant"].add(cid)
            if es_rows[cid].index_tenant == tenant:  # another tenant's chunk, in this index
                found.strays[cid] = es_rows[cid]
        else:
            found.drift["orphaned"].add(cid)
            found.orphan_copies[cid] = es_rows[cid]
    for cid, (version, fingerprint) in pg_rows.items():
        copy = es_rows.get(cid)
        if copy and (
            copy.version != version
            or copy.stored_fingerprint != fingerprint
            or copy.fields_fingerprint != fingerprint
        ):
            found.drift["stale"].add(cid)
            if copy.es_version > version:
                found.unrepairable.add(cid)
    # A chunk whose outbox row is still waiting is being written: the relay will make the
    # stores agree (and a repair would only repeat the write).
    waiting = outbox_repo.chunks_with_queued_writes(
        session, sorted(set().union(*found.drift.values()))
    )
    report.in_flight |= waiting
    for name, ids in found.drift.items():
        report.in_flight_drift[name] |= ids & waiting
        ids -= waiting
    found.unrepairable -= waiting
    for cid in set().union(*found.drift.values()):
        found.versions[cid] = pg_rows[cid][0] if cid in pg_rows else es_rows[cid].version
    for name, ids in found.drift.items():
        report.drift[name] |= ids
    report.unrepairable.extend(sorted(found.unrepairable))
    if repair:
        _queue_repairs(session, vectors, found, report)


def _queue_repairs(
    session: Session, vectors: VectorAudit, found: _RangeDrift, report: ReconcileReport
) -> None:
    drifted = set().union(*found.drift.values())  # chunks in flight are not among them
    # A write that is a dead letter at this version (or a newer one) would fail again: held
    # for the operator. One of an older version does not block the repair of a newer one.
    dead = jobs_repo.dead_lettered_versions(session, sorted(drifted))
    held = {cid for cid, version in dead.items() if version >= found.versions[cid]}
    rewrite = (
        (found.drift["missing"] | found.drift["stale"] | found.drift["wrong_tenant"])
        - found.unrepairable
        - held
    )
    entries = [
        outbox_repo.OutboxEntry(
            chunk.tenant_id, chunk.document_id, OutboxOp.REPAIR, chunk.version, [chunk.id]
        )
        for chunk in vectors.chunks_by_ids(sorted(rewrite)).values()
    ]
    orphans = sorted(found.drift["orphaned"] - held)
    versions = documents_repo.document_versions_for_chunks(session, orphans)
    for cid in orphans:
        copy = found.orphan_copies[cid]
        # At least the copy's own version, so Elasticsearch accepts the delete; at least the
        # document's current version, the newest Postgres has, so no later write is blocked.
        # The relay checks Postgres again when it applies it.
        doc_id, doc_version = versions.get(cid, (document_id_of(cid), 0))
        entries.append(
            outbox_repo.OutboxEntry(
                copy.index_tenant or copy.tenant_id,  # the index it is in
                doc_id,
                OutboxOp.PURGE,
                max(copy.es_version, doc_version),
                [cid],
            )
        )
    # A copy in another tenant's index than its chunk's: deleted from that index (the
    # chunk's own copy is rewritten above, or by its tenant's reconcile).
    for cid, stray in sorted(found.strays.items()):
        if stray.index_tenant is None:
            continue
        # A row for the chunk's own index does not hold this one, in another index, back.
        if not outbox_repo.chunks_with_queued_writes(session, [cid], stray.index_tenant):
            entries.append(
                outbox_repo.OutboxEntry(
                    stray.index_tenant, document_id_of(cid), OutboxOp.PURGE, stray.es_version, [cid]
                )
            )
    outbox_repo.add_outbox_entries(session, entries)
    report.repaired_ids |= {cid for e in entries for cid in e.chunk_ids}
    report.repairs_held |= held
