"""What reconciliation finds and queues: its report, and the comparison of one range of
buckets' rows in both stores (missing, stale, orphaned, wrong-tenant copies, and those a write
still in the outbox will settle), with the repairs it queues in the caller's transaction."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from shared.documents import repository as documents_repo
from shared.jobs import repository as jobs_repo
from shared.models import OutboxOp
from shared.outbox import repository as outbox_repo
from shared.stores.ports import IndexAudit, VectorAudit
from shared.stores.schemas import EsCopy, Fingerprints, document_id_of

log = logging.getLogger(__name__)

CLASSES = ("missing", "stale", "orphaned", "wrong_tenant")
SAMPLE = 10
# Ids per Elasticsearch ids query and per Postgres array parameter.
ID_PAGE = 10_000


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


@dataclass
class _RangeDrift:
    drift: dict[str, set[str]] = field(default_factory=lambda: {c: set() for c in CLASSES})
    orphan_copies: dict[str, EsCopy] = field(default_factory=dict)
    # copies of a chunk in another tenant's index than its own: deleted from there
    strays: dict[str, EsCopy] = field(default_factory=dict)
    unrepairable: set[str] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)  # each drifted chunk's newest version


def purge_foreign(
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


def compare_range(
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
    _classify_missing(found, index, tenant, [cid for cid in pg_rows if cid not in es_rows])
    _classify_extra(found, vectors, tenant, es_rows, [c for c in es_rows if c not in pg_rows])
    _classify_stale(found, pg_rows, es_rows)
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


def _classify_missing(
    found: _RangeDrift, index: IndexAudit, tenant: str, missing: list[str]
) -> None:
    """Postgres' chunks with no copy in the tenant's index: missing, or in the wrong place."""
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


def _classify_extra(
    found: _RangeDrift,
    vectors: VectorAudit,
    tenant: str,
    es_rows: dict[str, EsCopy],
    extra: list[str],
) -> None:
    """Copies Postgres does not hold for the tenant: another tenant's, or nobody's."""
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


def _classify_stale(found: _RangeDrift, pg_rows: Fingerprints, es_rows: dict[str, EsCopy]) -> None:
    """Copies at another version or with other fields than Postgres' chunk; one newer than
    Postgres cannot be repaired by a write (Elasticsearch keeps the newer version)."""
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
