"""Reconciliation's reads (which tenants the index holds, per-bucket sums of a tenant's copies,
the copies with their fingerprints recomputed from their fields), counts, and the cluster's
health."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from elasticsearch import NotFoundError

from shared.stores.buckets import BUCKETS
from shared.stores.chunk_index.base import (
    COPIED_FIELDS,
    IndexBase,
)
from shared.stores.elastic import raises_store_errors
from shared.stores.es_index import chunks_prefix
from shared.stores.schemas import (
    BucketStats,
    EsCopy,
    Fingerprints,
)


@raises_store_errors
class IndexAuditing(IndexBase):
    """IndexAudit (shared/stores/ports.py)."""

    def refresh(self, tenant_id: str | None = None) -> None:
        """Make every write acknowledged so far (of one tenant, or all) visible to reads."""
        try:
            self.es.indices.refresh(index=self._target(tenant_id) if tenant_id else self.alias)
        except NotFoundError:
            return

    def tenants(self) -> set[str]:
        """The tenants whose copies it holds, and those that have an index (even one whose
        copies all claim other tenants)."""
        response = self.es.search(
            index=self.alias,
            size=0,
            aggs={"tenants": {"terms": {"field": "tenant_id", "size": 65536}}},
        )
        found = {b["key"] for b in response["aggregations"]["tenants"]["buckets"]}
        if self.per_tenant():
            prefix = f"{chunks_prefix(self.settings)}t-"
            try:
                aliases = self.es.indices.get_alias(name=f"{prefix}*")
            except NotFoundError:
                return found
            for held in aliases.values():
                found |= {a.removeprefix(prefix) for a in held["aliases"] if a.startswith(prefix)}
        return found

    def count_of_tenant(self, tenant_id: str | None) -> int:
        """Copies of one tenant (every tenant's when None)."""
        if tenant_id is None:
            return self._count(self.alias, None)
        return self._count(self._target(tenant_id), {"term": {"tenant_id": tenant_id}})

    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]:
        """The tenant's per-bucket sums, and how many of its copies carry no bucket (written
        before buckets existed)."""
        try:
            response = self.es.search(
                index=self._target(tenant),
                size=0,
                query={"term": {"tenant_id": tenant}},
                aggs={
                    "buckets": {
                        "terms": {"field": "bucket", "size": BUCKETS},
                        "aggs": {
                            "v": {"sum": {"field": "version"}},
                            "h": {"sum": {"field": "fingerprint"}},
                        },
                    },
                    "unbucketed": {"missing": {"field": "bucket"}},
                },
            )
        except NotFoundError:
            return {}, 0
        aggs = response["aggregations"]
        stats = {
            int(b["key"]): (int(b["doc_count"]), int(b["v"]["value"]), int(b["h"]["value"]))
            for b in aggs["buckets"]["buckets"]
        }
        return stats, int(aggs["unbucketed"]["doc_count"])

    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]:
        """The tenant's copies in ``buckets`` (and, with ``unbucketed``, those without one)."""
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
        try:
            return self._scan(self._target(tenant), query)
        except NotFoundError:
            return {}

    def foreign_copies(self, tenant: str) -> dict[str, EsCopy]:
        """Copies in the tenant's index that claim another tenant (none can on the shared
        layout, where a copy's index is every tenant's): reconciliation finds those of the
        tenant's own chunks through its sums, and deletes the others from this index."""
        if not self.per_tenant():
            return {}
        query = {"bool": {"must_not": [{"term": {"tenant_id": tenant}}]}}
        try:
            return self._scan(self._target(tenant), query)
        except NotFoundError:
            return {}

    def fingerprints_in_buckets(self, tenant: str, buckets: list[int]) -> Fingerprints:
        """chunk id -> (version, stored fingerprint) of the tenant's copies in ``buckets``."""
        copies = self.copies_in_buckets(tenant, buckets)
        return {cid: (c.version, c.stored_fingerprint) for cid, c in copies.items()}

    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]:
        """The copies of these chunk ids, in whichever live index, looked up ``page`` at a
        time. (A copy in two indices, one of them another tenant's, shows the latter.)"""
        ordered = sorted(ids)
        copies: dict[str, EsCopy] = {}
        for start in range(0, len(ordered), page):
            wanted = ordered[start : start + page]
            # A plain search, not a scroll: over every tenant's index a scroll would hold a
            # context on each shard (Elasticsearch allows 500 per node by default). A chunk
            # id is in at most a few indices, so 4 hits per id bound the answer.
            response = self.es.search(
                index=self.alias,
                query={"ids": {"values": wanted}},
                size=min(4 * len(wanted), 10_000),
                version=True,
                source_includes=COPIED_FIELDS,
            )
            for hit in response["hits"]["hits"]:
                copy = self._copy(hit)
                held = copies.get(hit["_id"])
                if held is None or copy.index_tenant != copy.tenant_id:
                    copies[hit["_id"]] = copy
        return copies


@raises_store_errors
class IndexHealthChecks(IndexBase):
    """IndexHealth (shared/stores/ports.py)."""

    def count_of_document(
        self, tenant_id: str, document_id: str, version: int | None = None
    ) -> int:
        """Copies of one document's chunks (only those at ``version`` if given)."""
        clauses: list[dict[str, Any]] = [
            {"term": {"tenant_id": tenant_id}},
            {"term": {"document_id": document_id}},
        ]
        if version is not None:
            clauses.append({"term": {"version": version}})
        return self._count(self._target(tenant_id), {"bool": {"filter": clauses}})

    def cluster_status(self, timeout_s: float) -> str:
        """green, yellow or red, as the cluster reports it within ``timeout_s``."""
        return str(self.es.options(request_timeout=timeout_s).cluster.health()["status"])
