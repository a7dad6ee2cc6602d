"""The chunk index (Elasticsearch) as reconciliation sees it: which tenants it holds, per-bucket
sums of each tenant's copies, and the copies themselves with their fingerprints recomputed from
their fields. Reconciliation talks to Elasticsearch only through this class; the contract it
keeps is tested in tests/test_chunk_index.py against the real store."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from elasticsearch import Elasticsearch, helpers

from shared.reconcile.buckets import BUCKETS, fingerprint_of_source
from shared.settings import Settings, get_settings
from shared.stores.elastic import get_es

# Fields read back from a copy: what its fingerprint covers, and the stored fingerprint.
COPIED_FIELDS = [
    "tenant_id",
    "document_id",
    "external_id",
    "version",
    "ordinal",
    "text_hash",
    "title",
    "section",
    "metadata",
    "fingerprint",
]

# bucket -> (copies, sum of versions, sum of fingerprints)
BucketStats = dict[int, tuple[int, int, int]]


@dataclass
class EsCopy:
    tenant_id: str
    version: int
    stored_fingerprint: int  # the number the relay wrote
    fields_fingerprint: int  # recomputed from the copy's fields
    es_version: int


class ChunkIndex:
    def __init__(self, es: Elasticsearch | None = None, settings: Settings | None = None) -> None:
        self.es = es or get_es()
        self.alias = (settings or get_settings()).es_chunks_alias()

    def refresh(self) -> None:
        """Make every write acknowledged so far visible to the reads below."""
        self.es.indices.refresh(index=self.alias)

    def tenants(self) -> set[str]:
        response = self.es.search(
            index=self.alias,
            size=0,
            aggs={"tenants": {"terms": {"field": "tenant_id", "size": 65536}}},
        )
        return {b["key"] for b in response["aggregations"]["tenants"]["buckets"]}

    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]:
        """The tenant's per-bucket sums, and how many of its copies carry no bucket (written
        before buckets existed)."""
        response = self.es.search(
            index=self.alias,
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
        return self._scan(query)

    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]:
        """The copies of these chunk ids, whatever their tenant, looked up ``page`` at a time."""
        ordered = sorted(ids)
        copies: dict[str, EsCopy] = {}
        for start in range(0, len(ordered), page):
            copies.update(self._scan({"ids": {"values": ordered[start : start + page]}}))
        return copies

    def _scan(self, query: dict[str, Any]) -> dict[str, EsCopy]:
        hits = helpers.scan(
            self.es,
            index=self.alias,
            query={"query": query, "version": True},
            _source=COPIED_FIELDS,
            size=2000,
        )
        return {
            h["_id"]: EsCopy(
                tenant_id=h["_source"].get("tenant_id", ""),
                version=int(h["_source"].get("version", 0)),
                stored_fingerprint=int(h["_source"].get("fingerprint", -1)),
                fields_fingerprint=fingerprint_of_source(h["_id"], h["_source"]),
                es_version=int(h.get("_version", 0)),
            )
            for h in hits
        }
