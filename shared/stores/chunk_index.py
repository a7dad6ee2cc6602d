"""The chunk index (Elasticsearch behind its alias), as the rest of Concord uses it:

* writes: versioned bulk requests with a result per item (the relay), the same lines to a
  reindex in progress, and whether a copy exists;
* reads for reconciliation: which tenants it holds, per-bucket sums of each tenant's copies,
  and the copies with their fingerprints recomputed from their fields;
* lexical search within one tenant, and counts.

Every request for chunks goes to Elasticsearch through this class (callers may build query
clauses: the search service its match clause, shared/search/filters.py the filters); the
contract it keeps is tested in tests/test_chunk_index.py against the real store. It lets the
client's errors through (ApiError, TransportError), which callers that degrade catch. The
index's creation, mapping and reindex are shared/stores/es_index.py and
shared/reconcile/reindex.py; a copy's shape is shared/stores/chunk_document.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from elasticsearch import Elasticsearch, helpers

from shared.reconcile.buckets import BUCKETS, fingerprint_of_source
from shared.settings import Settings, get_settings
from shared.stores.elastic import get_es
from shared.stores.es_index import reindex_target

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


class ChunkIndex(Protocol):
    """What Concord needs from a chunk index; ElasticsearchChunkIndex is the one there is."""

    def bulk(self, lines: list[dict[str, Any]]) -> Any: ...
    def reindex_target(self) -> str | None: ...
    def bulk_to(self, target: str, lines: list[dict[str, Any]]) -> Any: ...
    def exists(self, chunk_id: str) -> bool: ...
    def count(self, query: dict[str, Any] | None = None) -> int: ...
    def count_of_tenant(self, tenant_id: str | None) -> int: ...
    def cluster_status(self, timeout_s: float) -> str: ...
    def lexical_search(
        self, tenant_id: str, match: dict[str, Any], filters: list[dict[str, Any]], size: int
    ) -> list[tuple[str, float]]: ...
    def refresh(self) -> None: ...
    def tenants(self) -> set[str]: ...
    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]: ...
    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]: ...
    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]: ...


class ElasticsearchChunkIndex:
    def __init__(self, es: Elasticsearch | None = None, settings: Settings | None = None) -> None:
        self.es = es or get_es()
        self.settings = settings or get_settings()
        self.alias = self.settings.es_chunks_alias()

    # -- writes

    def bulk(self, lines: list[dict[str, Any]]) -> Any:
        """One bulk request (action and document lines) to the alias; Elasticsearch's answer,
        with a result per item. Raises what the client raises for a refused request."""
        return self.es.bulk(operations=lines, index=self.alias, refresh=False)

    def reindex_target(self) -> str | None:
        """The index a reindex in progress is building, if any."""
        return reindex_target(self.es, self.settings)

    def bulk_to(self, target: str, lines: list[dict[str, Any]]) -> Any:
        return self.es.bulk(operations=lines, index=target, refresh=False)

    def exists(self, chunk_id: str) -> bool:
        return bool(self.es.exists(index=self.alias, id=chunk_id))

    # -- reads

    def count(self, query: dict[str, Any] | None = None) -> int:
        return int(self.es.count(index=self.alias, query=query)["count"])

    def count_of_tenant(self, tenant_id: str | None) -> int:
        """Copies of one tenant (every tenant's when None)."""
        return self.count({"term": {"tenant_id": tenant_id}} if tenant_id is not None else None)

    def cluster_status(self, timeout_s: float) -> str:
        """green, yellow or red, as the cluster reports it within ``timeout_s``."""
        return str(self.es.options(request_timeout=timeout_s).cluster.health()["status"])

    def lexical_search(
        self,
        tenant_id: str,
        match: dict[str, Any],
        filters: list[dict[str, Any]],
        size: int,
    ) -> list[tuple[str, float]]:
        """(chunk id, BM25 score), best first, of ``tenant_id``'s copies only: the tenant
        filter is added here, so no caller can search another tenant's chunks."""
        response = self.es.search(
            index=self.alias,
            size=size,
            query={
                "bool": {
                    "must": [match],
                    "filter": [{"term": {"tenant_id": tenant_id}}, *filters],
                }
            },
            source=False,
        )
        return [(hit["_id"], float(hit["_score"])) for hit in response["hits"]["hits"]]

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
