"""Reconciliation: prove that Elasticsearch holds exactly the live chunks of Postgres (the
source of truth), at their versions and content hashes, and repair what differs.

Cost grows with the drift, not the corpus: per tenant, both stores report per-bucket
(count, sum of versions, sum of content-hash numbers); only buckets that differ are read chunk
by chunk. Drift is classified as

* ``missing``: live in Postgres, absent from Elasticsearch;
* ``stale``: in both, but Elasticsearch holds another version or content hash;
* ``orphaned``: in Elasticsearch but not live in Postgres (tombstoned or superseded);
* ``wrong_tenant``: in Elasticsearch under another tenant than Postgres says.

Repairs go through the outbox, the same idempotent write path as ingestion: ``repair`` rows
re-send the Postgres chunk, ``purge`` rows delete, both with external versions that may
overwrite an equal version (a corrupted copy) but never a newer one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elasticsearch import Elasticsearch, helpers
from sqlalchemy.orm import Session

from shared.db import unit_of_work
from shared.ingest import relay
from shared.ingest import repository as ingest_repo
from shared.models import OutboxOp, ReconcileRun
from shared.reconcile import repository as repo
from shared.reconcile.buckets import BUCKETS
from shared.settings import get_settings
from shared.stores.elastic import get_es

CLASSES = ("missing", "stale", "orphaned", "wrong_tenant")
SAMPLE = 10


@dataclass
class EsCopy:
    tenant_id: str
    version: int
    text_hash: str
    es_version: int


@dataclass
class ReconcileReport:
    tenants: int = 0
    buckets_scanned: int = 0
    buckets_differing: int = 0
    ids_read: int = 0
    drift: dict[str, set[str]] = field(default_factory=lambda: {c: set() for c in CLASSES})
    repaired_ids: set[str] = field(default_factory=set)  # chunks with a repair queued
    unrepairable: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def repairs_queued(self) -> int:
        return len(self.repaired_ids)

    def total(self) -> int:
        return sum(len(ids) for ids in self.drift.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenants": self.tenants,
            "buckets_scanned": self.buckets_scanned,
            "buckets_differing": self.buckets_differing,
            "ids_read": self.ids_read,
            "counts": {c: len(ids) for c, ids in self.drift.items()},
            "samples": {c: sorted(ids)[:SAMPLE] for c, ids in self.drift.items()},
            "total_drift": self.total(),
            "repairs_queued": self.repairs_queued,
            "unrepairable": self.unrepairable[:SAMPLE],
            "duration_s": round(self.duration_s, 3),
        }


def reconcile(
    tenant: str | None = None, repair: bool = False, es: Elasticsearch | None = None
) -> ReconcileReport:
    """Compare (and with ``repair``, queue repairs for) one tenant or every tenant."""
    es = es or get_es()
    alias = get_settings().es_chunks_alias()
    started = time.monotonic()
    report = ReconcileReport()
    es.indices.refresh(index=alias)  # compare against every write acknowledged so far
    with unit_of_work() as uow:
        tenants = (
            [tenant] if tenant else sorted(repo.pg_tenants(uow.session) | _es_tenants(es, alias))
        )
        report.tenants = len(tenants)
        for t in tenants:
            _compare_tenant(uow.session, es, alias, t, report)
        if repair and report.total():
            _queue_repairs(uow.session, es, alias, report)
    report.duration_s = time.monotonic() - started
    with unit_of_work() as uow:
        uow.session.add(
            ReconcileRun(
                tenant_id=tenant,
                duration_s=report.duration_s,
                repair=repair,
                report=report.as_dict(),
            )
        )
    return report


def reconcile_and_verify(tenant: str | None = None) -> tuple[ReconcileReport, ReconcileReport]:
    """Repair, drain the outbox now, and compare again: the second report shows what remains."""
    first = reconcile(tenant, repair=True)
    if first.repaired_ids:
        drain_repairs(first.repaired_ids)
        get_es().indices.refresh(index=get_settings().es_chunks_alias())
    return first, reconcile(tenant, repair=False)


def drain_repairs(chunk_ids: set[str], wait_s: float = 30.0) -> None:
    """Send the queued repairs and wait until they have left the outbox.

    A running relay worker may have claimed some of them first (claims skip locked rows), so an
    empty drain here does not mean they were sent: wait for the other relay's transaction too.
    Rows postponed because Elasticsearch is unreachable are not waited for; the second report
    then shows their drift as remaining.
    """
    deadline = time.monotonic() + wait_s
    ids = sorted(chunk_ids)
    while True:
        relay.drain(max_batches=10_000)
        with unit_of_work() as uow:
            pending = ingest_repo.due_outbox_rows_for(uow.session, ids)
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def _es_tenants(es: Elasticsearch, alias: str) -> set[str]:
    response = es.search(
        index=alias, size=0, aggs={"tenants": {"terms": {"field": "tenant_id", "size": 65536}}}
    )
    return {b["key"] for b in response["aggregations"]["tenants"]["buckets"]}


def _es_bucket_stats(
    es: Elasticsearch, alias: str, tenant: str
) -> tuple[dict[int, tuple[int, int, int]], int]:
    response = es.search(
        index=alias,
        size=0,
        query={"term": {"tenant_id": tenant}},
        aggs={
            "buckets": {
                "terms": {"field": "bucket", "size": BUCKETS},
                "aggs": {"v": {"sum": {"field": "version"}}, "h": {"sum": {"field": "hash_num"}}},
            },
            "unbucketed": {"missing": {"field": "bucket"}},
        },
    )
    aggs = response["aggregations"]
    stats = {
        int(b["key"]): (int(b["doc_count"]), int(b["v"]["value"]), int(b["h"]["value"]))
        for b in aggs["buckets"]["buckets"]
    }
    return stats, int(aggs["unbucketed"]["doc_count"])


def _es_copies(
    es: Elasticsearch, alias: str, tenant: str, buckets: list[int], unbucketed: bool
) -> dict[str, EsCopy]:
    should: list[dict[str, Any]] = []
    if buckets:
        should.append({"terms": {"bucket": buckets}})
    if unbucketed:
        should.append({"bool": {"must_not": {"exists": {"field": "bucket"}}}})
    if not should:
        return {}
    query = {
        "bool": {
            "filter": [{"term": {"tenant_id": tenant}}],
            "should": should,
            "minimum_should_match": 1,
        }
    }
    return _scan(es, alias, query)


def _scan(es: Elasticsearch, alias: str, query: dict[str, Any]) -> dict[str, EsCopy]:
    hits = helpers.scan(
        es,
        index=alias,
        query={"query": query, "version": True},
        _source=["tenant_id", "version", "text_hash"],
        size=2000,
    )
    return {
        h["_id"]: EsCopy(
            h["_source"].get("tenant_id", ""),
            int(h["_source"].get("version", 0)),
            h["_source"].get("text_hash", ""),
            int(h.get("_version", 0)),
        )
        for h in hits
    }


def _es_by_ids(es: Elasticsearch, alias: str, ids: Iterable[str]) -> dict[str, EsCopy]:
    ids = list(ids)
    if not ids:
        return {}
    return _scan(es, alias, {"ids": {"values": ids}})


def _compare_tenant(
    session: Session, es: Elasticsearch, alias: str, tenant: str, report: ReconcileReport
) -> None:
    pg_stats = repo.bucket_stats(session, tenant)
    es_stats, unbucketed = _es_bucket_stats(es, alias, tenant)
    report.buckets_scanned += BUCKETS
    differing = sorted(
        b for b in set(pg_stats) | set(es_stats) if pg_stats.get(b) != es_stats.get(b)
    )
    report.buckets_differing += len(differing)
    if not differing and not unbucketed:
        return
    pg_rows = repo.chunks_in_buckets(session, tenant, differing)
    es_rows = _es_copies(es, alias, tenant, differing, bool(unbucketed))
    if unbucketed:  # legacy copies without a bucket: compare them with their Postgres rows
        pg_rows.update(
            repo.chunks_by_ids(session, tenant, [cid for cid in es_rows if cid not in pg_rows])
        )
    report.ids_read += len(pg_rows) + len(es_rows)

    missing = [cid for cid in pg_rows if cid not in es_rows]
    elsewhere = _es_by_ids(es, alias, missing)
    for cid in missing:
        copy = elsewhere.get(cid)
        report.drift["wrong_tenant" if copy and copy.tenant_id != tenant else "missing"].add(cid)
    extra = [cid for cid in es_rows if cid not in pg_rows]
    owners = repo.chunk_tenants(session, extra)
    for cid in extra:
        owner = owners.get(cid)
        report.drift["wrong_tenant" if owner and owner != tenant else "orphaned"].add(cid)
    for cid, (version, text_hash) in pg_rows.items():
        copy = es_rows.get(cid)
        if copy and (copy.version != version or copy.text_hash != text_hash):
            report.drift["stale"].add(cid)
            if copy.es_version > version:
                report.unrepairable.append(cid)


def _queue_repairs(
    session: Session, es: Elasticsearch, alias: str, report: ReconcileReport
) -> None:
    rewrite = report.drift["missing"] | report.drift["stale"] | report.drift["wrong_tenant"]
    rewrite -= set(report.unrepairable)
    for chunk in ingest_repo.chunks_by_ids(session, sorted(rewrite)).values():
        ingest_repo.add_outbox(
            session,
            tenant_id=chunk.tenant_id,
            document_id=chunk.document_id,
            op=OutboxOp.REPAIR,
            version=chunk.version,
            chunk_ids=[chunk.id],
        )
        report.repaired_ids.add(chunk.id)
    orphans = sorted(report.drift["orphaned"])
    copies = _es_by_ids(es, alias, orphans)
    versions = repo.document_versions_for_chunks(session, orphans)
    for cid in orphans:
        copy = copies.get(cid)
        if copy is None:
            continue
        # At least the copy's own version, so Elasticsearch accepts the delete; at least the
        # document's current version, the newest Postgres has, so no later write is blocked.
        doc_id, doc_version = versions.get(cid, (None, 0))
        ingest_repo.add_outbox(
            session,
            tenant_id=copy.tenant_id,
            document_id=doc_id or repo.document_id_of(cid),
            op=OutboxOp.PURGE,
            version=max(copy.es_version, doc_version),
            chunk_ids=[cid],
        )
        report.repaired_ids.add(cid)
