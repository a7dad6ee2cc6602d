"""The chunk index (Elasticsearch behind its alias), as the rest of Concord uses it:

* writes: versioned bulk requests with a result per item (the relay), the same lines to a
  reindex in progress, and whether a copy exists;
* lexical search (BM25) within one tenant: the match query and the tenant filter are built
  here, from the query text and the request's filters, so no caller can search another
  tenant's copies or put user text into anything but a ``multi_match``;
* reads for reconciliation: which tenants it holds, per-bucket sums of each tenant's copies,
  and the copies with their fingerprints recomputed from their fields;
* reindex: a target index behind its own alias, the progress stored in its ``_meta``, and the
  atomic switch of the alias;
* counts and the cluster's health.

Every request for chunks goes to Elasticsearch through this class; the contract it keeps is
tested in tests/stores/test_contract.py against the real store, with the same tests as the
vector store. It lets the client's errors through (ApiError, TransportError), which callers
that degrade catch. The index's creation and mapping are shared/stores/es_index.py; a copy's
shape is shared/stores/chunk_document.py."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from elasticsearch import Elasticsearch, helpers

from shared.models import Chunk, Document
from shared.reconcile.buckets import BUCKETS, fingerprint_of_source
from shared.search.filters import es_filters
from shared.search.schemas import Filters
from shared.settings import Settings, get_settings
from shared.stores import english_analysis
from shared.stores.chunk_document import es_document
from shared.stores.elastic import get_es
from shared.stores.es_index import (
    concrete_index_name,
    index_body,
    reindex_target,
    reindexing_alias,
)
from shared.stores.schemas import BucketStats, EsCopy, Fingerprints

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
REINDEX_PROGRESS = "reindex_last_id"  # in the target index's _meta


class ChunkIndex(Protocol):
    """What Concord needs from a chunk index; ElasticsearchChunkIndex is the one there is."""

    def bulk(self, lines: list[dict[str, Any]]) -> Any: ...
    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]: ...
    def reindex_target(self) -> str | None: ...
    def bulk_to(self, target: str, lines: list[dict[str, Any]]) -> Any: ...
    def exists(self, chunk_id: str) -> bool: ...
    def count(self, query: dict[str, Any] | None = None) -> int: ...
    def count_of_tenant(self, tenant_id: str | None) -> int: ...
    def count_of_document(self, document_id: str, version: int | None = None) -> int: ...
    def cluster_status(self, timeout_s: float) -> str: ...
    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]: ...
    def refresh(self) -> None: ...
    def tenants(self) -> set[str]: ...
    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]: ...
    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]: ...
    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]: ...
    def fingerprints_in_buckets(self, tenant: str, buckets: list[int]) -> Fingerprints: ...
    def start_reindex(self) -> tuple[str, str, bool]: ...
    def copy_to(self, target: str, chunks: Iterable[tuple[Chunk, Document]]) -> None: ...
    def mark_reindex_progress(self, target: str, last_id: str) -> None: ...
    def finish_reindex(self, target: str) -> list[str]: ...


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

    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]:
        """Each chunk's copy, at its Postgres version as an external version: the status of
        each item, in order (409 when the index holds that version or a newer one)."""
        lines: list[dict[str, Any]] = []
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
            lines += [{"index": action}, es_document(chunk, doc)]
        if not lines:
            return []
        items = self.bulk(lines)["items"]
        return [int(next(iter(item.values()))["status"]) for item in items]

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

    def count_of_document(self, document_id: str, version: int | None = None) -> int:
        """Copies of one document's chunks (only those at ``version`` if given)."""
        clauses: list[dict[str, Any]] = [{"term": {"document_id": document_id}}]
        if version is not None:
            clauses.append({"term": {"version": version}})
        return self.count({"bool": {"filter": clauses}})

    def cluster_status(self, timeout_s: float) -> str:
        """green, yellow or red, as the cluster reports it within ``timeout_s``."""
        return str(self.es.options(request_timeout=timeout_s).cluster.health()["status"])

    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]:
        """(chunk id, BM25 score), best first, of ``tenant_id``'s copies that pass ``filters``:
        a ``multi_match`` (best fields) of ``text`` over the boosted fields, with the tenant
        filter added here. With the Python English analysis (the default) the query is
        analyzed as the copies were and matched against their ``stemmed`` fields; a query of
        stop words only matches nothing."""
        boosts = field_boosts or self.settings.lexical_field_boosts
        prefix = ""
        if self.settings.lexical_analysis == "python-english":
            text, prefix = english_analysis.analyze(text), "stemmed."
            if not text:
                return []
        match = {
            "multi_match": {
                "query": text,
                "fields": [f"{prefix}{name}^{boost}" for name, boost in boosts.items()],
                "tie_breaker": (
                    self.settings.lexical_tie_breaker if tie_breaker is None else tie_breaker
                ),
            }
        }
        response = self.es.search(
            index=self.alias,
            size=size,
            query={
                "bool": {
                    "must": [match],
                    "filter": [
                        {"term": {"tenant_id": tenant_id}},
                        *(es_filters(filters) if filters is not None else []),
                    ],
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

    def fingerprints_in_buckets(self, tenant: str, buckets: list[int]) -> Fingerprints:
        """chunk id -> (version, stored fingerprint) of the tenant's copies in ``buckets``."""
        copies = self.copies_in_buckets(tenant, buckets)
        return {cid: (c.version, c.stored_fingerprint) for cid, c in copies.items()}

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

    # -- reindex

    def start_reindex(self) -> tuple[str, str, bool]:
        """The target of the reindex in progress, or a new empty index marked as the target
        (from then on the relay dual-writes to it): (target, the last chunk id copied into
        it, whether it was already in progress)."""
        target = self.reindex_target()
        if target is not None:
            mapping = self.es.indices.get_mapping(index=target)[target]["mappings"]
            return target, str(mapping.get("_meta", {}).get(REINDEX_PROGRESS, "")), True
        target = f"{concrete_index_name(self.settings)}-r{int(time.time())}"
        self.es.indices.create(index=target, **index_body(self.settings))
        self.es.indices.put_alias(index=target, name=reindexing_alias(self.settings))
        return target, "", False

    def copy_to(self, target: str, chunks: Iterable[tuple[Chunk, Document]]) -> None:
        """Copies of ``chunks`` into ``target`` at their versions: one a dual write already
        put there at a newer version stays."""
        actions = (
            {
                "_index": target,
                "_id": chunk.id,
                "version": chunk.version,
                "version_type": "external",
                "_source": es_document(chunk, doc),
            }
            for chunk, doc in chunks
        )
        helpers.bulk(self.es, actions, raise_on_error=False, chunk_size=1000)

    def mark_reindex_progress(self, target: str, last_id: str) -> None:
        """Every chunk up to ``last_id`` is copied: an interrupted reindex resumes after it."""
        mapping = self.es.indices.get_mapping(index=target)[target]["mappings"]
        meta = {**mapping.get("_meta", {}), REINDEX_PROGRESS: last_id}
        self.es.indices.put_mapping(index=target, meta=meta)

    def finish_reindex(self, target: str) -> list[str]:
        """Move the alias to ``target`` in one atomic call, end the dual writes, delete the
        indices it pointed at before; returns their names."""
        self.es.indices.refresh(index=target)
        old = list(self.es.indices.get_alias(name=self.alias))
        self.es.indices.update_aliases(
            actions=[
                *({"remove": {"index": index, "alias": self.alias}} for index in old),
                {"add": {"index": target, "alias": self.alias, "is_write_index": True}},
                {"remove": {"index": target, "alias": reindexing_alias(self.settings)}},
            ]
        )
        for index in old:
            self.es.indices.delete(index=index)
        return old
