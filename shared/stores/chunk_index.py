"""The chunk index (Elasticsearch: an index per tenant behind aliases, shared/stores/es_index.py),
as the rest of Concord uses it:

* writes: versioned bulk requests with a result per item (the relay), each line sent to its
  tenant's index (created at the tenant's first write), the same lines to a reindex in
  progress, and whether a copy exists;
* lexical search (BM25) within one tenant, in that tenant's own index, so its scores come from
  its own documents only: the match query and the tenant filter are built here, from the query
  text and the request's filters, so no caller can search another tenant's copies or put user
  text into anything but a ``multi_match``;
* reads for reconciliation: which tenants it holds, per-bucket sums of each tenant's copies,
  and the copies with their fingerprints recomputed from their fields;
* reindex: the next generation of indices built beside the live one (every tenant's, or one
  tenant's index), its progress and scope stored in its anchor's ``_meta``, and the atomic
  switch of the aliases;
* counts and the cluster's health.

Every request for chunks goes to Elasticsearch through this class; the contract it keeps is
tested in tests/stores/test_contract.py against the real store, with the same tests as the
vector store. Its methods raise Concord's store errors (StoreUnavailable: no answer, 429, 5xx;
StoreRejected: any other refusal; shared/stores/elastic.store_error), never the client's, which
callers that degrade or retry catch; a tenant with no index yet reads as empty. A copy's shape is
shared/stores/chunk_document.py.

On the shared layout of older deployments (one index for every tenant) the same calls work on
that index, with the tenant filter, until ``concord reindex`` moves it to an index per tenant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from elasticsearch import ApiError, BadRequestError, Elasticsearch, NotFoundError, helpers

from shared.errors import Conflict
from shared.metrics import LEXICAL_ANALYSIS_FALLBACKS
from shared.models import Chunk, Document
from shared.settings import LexicalAnalysis, Settings, get_settings
from shared.stores import english_analysis
from shared.stores.buckets import BUCKETS, fingerprint_of_source
from shared.stores.chunk_document import es_document
from shared.stores.elastic import get_es, raises_store_errors
from shared.stores.es_index import (
    REINDEX_TENANT,
    Layout,
    anchor_index,
    chunks_prefix,
    ensure_index,
    index_body,
    live_layout,
    new_generation,
    parse_index_name,
    reindex_in_progress,
    reindexing_alias,
    tenant_alias,
    tenant_index,
)
from shared.stores.filters import Filters, es_filters
from shared.stores.ports import (
    ChunkWriter,
    IndexAudit,
    IndexHealth,
    IndexReindex,
    LexicalSearch,
)
from shared.stores.schemas import (
    BucketStats,
    EsCopy,
    Fingerprints,
    IndexUnavailable,
    ReindexStart,
    TenantLines,
)

log = logging.getLogger(__name__)

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
REINDEX_PROGRESS = "reindex_last_id"  # in the target generation's anchor's _meta
# How long a process trusts what it read of the live layout: a reindex's switch is seen
# within this (the relay's writes to a tenant's alias are right either side of it).
LAYOUT_TTL_S = 2.0


# Per process: the indices known to exist (tenant aliases and concrete indices), and the
# layout last read, with when it was read.
_existing: set[str] = set()
_layout: dict[str, tuple[float, Layout]] = {}
# Per process: the analysis each tenant's index was last found to index, where that is not the
# configured one (an index made before CONCORD_LEXICAL_ANALYSIS changed): its searches go
# straight to those fields instead of failing first, and it is logged once.
_found_analysis: dict[str, LexicalAnalysis] = {}
# Per process: the settings each generation's indices are made under (its anchor's shape; a
# generation's shape never changes, a discarded one's name is never used again).
_generation_settings: dict[tuple[str, str], Settings] = {}
# Per process: the tenant each generation being built rebuilds, None for every tenant (fixed
# when the generation starts, like its shape).
_generation_tenant: dict[tuple[str, str], str | None] = {}

# What of a generation's shape its anchor records, as the settings name them.
GENERATION_SHAPE = ("es_shards", "es_replicas", "lexical_analysis", "es_text_analyzer")


def _shape_of(anchor: dict[str, Any]) -> dict[str, Any]:
    """What of GENERATION_SHAPE an anchor (as ``indices.get`` describes it) was made with."""
    made = anchor["settings"]["index"]
    shape: dict[str, Any] = {
        "es_shards": int(made["number_of_shards"]),
        "es_replicas": int(made["number_of_replicas"]),
    }
    # An anchor made before indices recorded their analysis says nothing of it: its
    # generation's indices are made under the creating process's.
    analysis = anchor["mappings"].get("_meta", {}).get("lexical_analysis")
    if analysis is not None:
        shape["lexical_analysis"] = analysis
    analyzer = anchor["mappings"].get("properties", {}).get("text", {}).get("analyzer")
    if analyzer is not None:
        shape["es_text_analyzer"] = analyzer
    return shape


# A reindex page's copies that Elasticsearch answers 429 or 5xx are sent again this often.
COPY_ATTEMPTS = 4
COPY_BACKOFF_S = 1.0


class ReindexOfAnotherScope(Conflict):
    """A reindex of other tenants than asked for was interrupted and waits to be resumed:
    one generation is built at a time (the relay dual-writes to one), so it is finished
    first."""


class ReindexCopyRefused(Exception):
    """Copies of a reindex page that Elasticsearch would not take: the reindex stops before
    its progress passes them (and so before switching to a generation missing them)."""


def _refused_copies(errors: Any) -> dict[str, int]:
    """chunk id -> status of each failed copy, but a version conflict: a dual write put a
    newer version there first, which is what the reindex wants."""
    refused = {}
    for error in errors:
        item = next(iter(error.values()))
        status = int(item.get("status", 500))
        if status != 409:
            refused[str(item.get("_id"))] = status
    return refused


class ChunkIndex(ChunkWriter, LexicalSearch, IndexAudit, IndexReindex, IndexHealth, Protocol):
    """Every port of the chunk index (shared/stores/ports.py); ElasticsearchChunkIndex is the
    one there is. Consumers take the narrowest port they use."""


@raises_store_errors
class ElasticsearchChunkIndex:
    def __init__(self, es: Elasticsearch | None = None, settings: Settings | None = None) -> None:
        self._es = es
        self.settings = settings or get_settings()
        self.alias = self.settings.es_chunks_alias()  # the read alias over every live index

    @property
    def es(self) -> Elasticsearch:
        """The client given, or the process's (looked up at each use: a composition root
        makes one adapter for the process's life, and the client may be made again)."""
        return self._es or get_es()

    # -- where a tenant's copies are

    def layout(self, fresh: bool = False) -> Layout:
        """The live layout, as read at most ``LAYOUT_TTL_S`` ago (``fresh``: read now)."""
        read_at, layout = _layout.get(self.alias, (0.0, Layout(None, None)))
        if fresh or time.monotonic() - read_at > LAYOUT_TTL_S:
            layout = live_layout(self.es, self.settings)
            _layout[self.alias] = (time.monotonic(), layout)
        return layout

    def forget(self, tenant_id: str) -> None:
        """Check the tenant's index again before its next write (it answered 404)."""
        _existing.discard(tenant_alias(self.settings, tenant_id))

    def per_tenant(self) -> bool:
        """Whether each tenant has an index of its own (False on the shared layout)."""
        return self.layout().per_tenant

    def _target(self, tenant_id: str) -> str:
        """Where the tenant's copies are read and written: its alias, or on the shared
        layout the one index every tenant shares."""
        layout = self.layout()
        return tenant_alias(self.settings, tenant_id) if layout.per_tenant else self.alias

    def prepare(self, tenant_ids: Iterable[str]) -> dict[str, IndexUnavailable]:
        """Make sure each tenant has its live index (created with its alias at the tenant's
        first write); returns the tenants whose index could not be created, with why."""
        if not self.per_tenant():
            return {}
        failed: dict[str, IndexUnavailable] = {}
        for tenant_id in sorted(set(tenant_ids)):
            try:
                self._ensure_tenant_index(tenant_id)
            except IndexUnavailable as e:
                failed[tenant_id] = e
        return failed

    def _ensure_tenant_index(self, tenant_id: str) -> None:
        alias = tenant_alias(self.settings, tenant_id)
        if alias in _existing:
            return
        if not self.es.indices.exists_alias(name=alias):
            generation = self.layout().generation or ensure_index(self.settings, self.es)
            self._create(
                tenant_index(self.settings, generation, tenant_id),
                {alias: {"is_write_index": True}, self.alias: {}},
            )
        _existing.add(alias)

    def _ensure_generation_index(self, generation: str, tenant_id: str) -> str:
        """The tenant's index in a generation being built (no aliases until the switch),
        made as the generation's anchor says whichever process makes it: the reindex's own
        copy or a relay's dual write, configured otherwise. Returns its name."""
        name = tenant_index(self.settings, generation, tenant_id)
        if name not in _existing:
            self._create(name, {}, self._generation_made_under(generation))
            _existing.add(name)
        return name

    def _generation_made_under(self, generation: str) -> Settings:
        """This process's settings with the generation's shape (shards, replicas, lexical
        analysis, text analyzer) as its anchor records it: what the process that started it
        configured."""
        key = (self.alias, generation)
        if key not in _generation_settings:
            shape = _shape_of(self._anchor(generation))
            _generation_settings[key] = self.settings.model_copy(update=shape)
        return _generation_settings[key]

    def _generation_tenant(self, generation: str) -> str | None:
        """The one tenant ``generation`` rebuilds (its anchor's ``_meta`` says), or None when
        it rebuilds every tenant."""
        key = (self.alias, generation)
        if key not in _generation_tenant:
            meta = self._anchor(generation)["mappings"].get("_meta", {})
            _generation_tenant[key] = meta.get(REINDEX_TENANT)
        return _generation_tenant[key]

    def _anchor(self, generation: str) -> dict[str, Any]:
        """The generation's anchor index as Elasticsearch describes it: settings and mappings
        (its shape, and in ``_meta`` the reindex's progress)."""
        anchor = anchor_index(self.settings, generation)
        return dict(self.es.indices.get(index=anchor)[anchor])

    def _create(
        self,
        name: str,
        aliases: dict[str, Any],
        made_under: Settings | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        body = index_body(made_under or self.settings)
        if meta:  # made with the index: no index is ever seen without it
            body["mappings"]["_meta"] = {**body["mappings"]["_meta"], **meta}
        try:
            self.es.indices.create(
                index=name, settings=body["settings"], mappings=body["mappings"], aliases=aliases
            )
            log.info("created chunk index %s", name)
        except BadRequestError as e:
            if e.error == "resource_already_exists_exception":
                return  # another process created it first
            raise IndexUnavailable(e.meta.status, f"{e.error}: {e.message}") from e
        except ApiError as e:
            raise IndexUnavailable(e.meta.status, f"{e.error}: {e.message}") from e

    # -- writes

    def bulk(self, requests: Sequence[TenantLines]) -> Any:
        """One bulk request of the rows' lines (action and document), each action sent to its
        tenant's live index; Elasticsearch's answer, with a result per item. ``prepare`` the
        tenants first. Raises what the client raises for a refused request."""
        if not self.layout().per_tenant:
            # The shared layout ends with a reindex's switch: writes check it, not a copy of
            # it cached by this process (the old alias takes no writes after the switch).
            self.layout(fresh=True)
        lines = self._addressed(requests, self._target)
        # require_alias: a write never makes Elasticsearch create an index of its own
        # (a tenant alias that went missing answers 404 for its rows instead).
        return self.es.bulk(operations=lines, refresh=False, require_alias=True)

    def _addressed(self, requests: Sequence[TenantLines], where: Any) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for tenant_id, row_lines in requests:
            index = where(tenant_id)
            for line in row_lines:
                op = next(iter(line)) if len(line) == 1 else None
                if op in ("index", "delete", "create", "update"):
                    line = {op: {**line[op], "_index": index}}
                lines.append(line)
        return lines

    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]:
        """Each chunk's copy, at its Postgres version as an external version: the status of
        each item, in order (409 when the index holds that version or a newer one)."""
        requests: list[TenantLines] = []
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
            requests.append((chunk.tenant_id, [{"index": action}, es_document(chunk, doc)]))
        if not requests:
            return []
        failed = self.prepare(t for t, _ in requests)
        if failed:
            raise next(iter(failed.values()))
        items = self.bulk(requests)["items"]
        return [int(next(iter(item.values()))["status"]) for item in items]

    def reindex_target(self) -> str | None:
        """The generation a reindex in progress is building, if any (the tenant it rebuilds
        remembered for ``bulk_to``)."""
        running = reindex_in_progress(self.es, self.settings)
        if running is None:
            return None
        _generation_tenant[(self.alias, running.generation)] = running.tenant_id
        return running.generation

    def bulk_to(self, generation: str, requests: Sequence[TenantLines]) -> Any:
        """The same lines to the tenants' indices of ``generation`` (a reindex's dual write);
        of a generation that rebuilds one tenant, that tenant's lines only."""
        rebuilt = self._generation_tenant(generation)
        if rebuilt is not None:
            requests = [(tenant, lines) for tenant, lines in requests if tenant == rebuilt]
        if not requests:
            return {"errors": False, "items": []}
        for tenant_id in {t for t, _ in requests}:
            self._ensure_generation_index(generation, tenant_id)
        lines = self._addressed(
            requests, lambda tenant: tenant_index(self.settings, generation, tenant)
        )
        return self.es.bulk(operations=lines, refresh=False)

    def exists(self, tenant_id: str, chunk_id: str) -> bool:
        try:
            return bool(self.es.exists(index=self._target(tenant_id), id=chunk_id))
        except NotFoundError:
            return False

    # -- reads

    def _count(self, index: str, query: dict[str, Any] | None) -> int:
        try:
            return int(self.es.count(index=index, query=query)["count"])
        except NotFoundError:  # a tenant with no index yet
            return 0

    def count_of_tenant(self, tenant_id: str | None) -> int:
        """Copies of one tenant (every tenant's when None)."""
        if tenant_id is None:
            return self._count(self.alias, None)
        return self._count(self._target(tenant_id), {"term": {"tenant_id": tenant_id}})

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

    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]:
        """(chunk id, BM25 score), best first, of ``tenant_id``'s copies that pass ``filters``,
        scored within the tenant's own index: a ``multi_match`` (best fields) of ``text`` over
        the boosted fields, with the tenant filter added here too. With the Python English
        analysis (the default) the query is analyzed as the copies were and matched against
        their ``stemmed`` fields; a query of stop words only matches nothing.

        An index indexes the fields of the analysis in effect when it was made (shared/stores/
        es_index.py): after CONCORD_LEXICAL_ANALYSIS changes, a tenant's index made before is
        searched under its own analysis until ``concord reindex`` builds it again."""
        configured = self.settings.lexical_analysis
        first = _found_analysis.get(tenant_id, configured)
        other: LexicalAnalysis = "elasticsearch" if first == "python-english" else "python-english"
        used = first
        try:
            hits = self._bm25(tenant_id, first, text, filters, size, field_boosts, tie_breaker)
        except BadRequestError as e:
            # Elasticsearch's words for a query of a field with "index": false
            if "since it is not indexed" not in str(e):
                raise
            used = other
            hits = self._bm25(tenant_id, other, text, filters, size, field_boosts, tie_breaker)
            if used == configured:  # reindexed since: back to the configured analysis
                _found_analysis.pop(tenant_id, None)
            else:
                _found_analysis[tenant_id] = used
                log.warning(
                    "tenant %s's index indexes the fields of lexical analysis %s, not those "
                    "of CONCORD_LEXICAL_ANALYSIS=%s: searched with them until `concord reindex`",
                    tenant_id,
                    used,
                    configured,
                )
        if used != configured:
            LEXICAL_ANALYSIS_FALLBACKS.inc()
        return hits

    def _bm25(
        self,
        tenant_id: str,
        analysis: LexicalAnalysis,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None,
        tie_breaker: float | None,
    ) -> list[tuple[str, float]]:
        boosts = field_boosts or self.settings.lexical_field_boosts
        prefix = ""
        if analysis == "python-english":
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
        try:
            response = self.es.search(
                index=self._target(tenant_id),
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
                # Several shards a tenant: their statistics pooled first, so that BM25 scores
                # are those of all the tenant's documents, as with one shard. Asked of every
                # index whatever CONCORD_ES_SHARDS says now (an index keeps the shards it was
                # made with until a reindex): Elasticsearch skips the extra round for a search
                # that meets one shard (SciFact, one shard: 3.9 ms p50 with it, 3.8 without).
                search_type="dfs_query_then_fetch",
            )
        except NotFoundError:  # no copy of this tenant was ever written
            return []
        return [(hit["_id"], float(hit["_score"])) for hit in response["hits"]["hits"]]

    def term_counts(self, tenant_id: str, terms: list[str]) -> tuple[int, dict[str, int]] | None:
        """The tenant's number of copies, and how many of them hold each of ``terms`` (stemmed
        terms of the Python English analysis) in any field BM25 reads; None where the index
        has no such fields (the Elasticsearch analysis). One request, counted within the
        tenant (on the shared layout too: no other tenant's words are counted)."""
        if self.settings.lexical_analysis != "python-english" or not terms:
            return None
        fields = [f"stemmed.{name}" for name in self.settings.lexical_field_boosts]
        try:
            response = self.es.search(
                index=self._target(tenant_id),
                size=0,
                track_total_hits=True,
                query={"bool": {"filter": [{"term": {"tenant_id": tenant_id}}]}},
                aggs={
                    "holding": {
                        "filters": {
                            "filters": {
                                term: {
                                    "bool": {
                                        "should": [{"term": {f: term}} for f in fields],
                                        "minimum_should_match": 1,
                                    }
                                }
                                for term in terms
                            }
                        }
                    }
                },
            )
        except NotFoundError:  # no copy of this tenant was ever written
            return 0, dict.fromkeys(terms, 0)
        buckets = response["aggregations"]["holding"]["buckets"]
        return int(response["hits"]["total"]["value"]), {
            term: int(buckets[term]["doc_count"]) for term in terms
        }

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

    def _scan(self, index: str, query: dict[str, Any]) -> dict[str, EsCopy]:
        hits = helpers.scan(
            self.es,
            index=index,
            query={"query": query, "version": True},
            _source=COPIED_FIELDS,
            size=2000,
        )
        copies: dict[str, EsCopy] = {}
        for h in hits:
            copy = self._copy(h)
            held = copies.get(h["_id"])
            if held is None or copy.index_tenant != copy.tenant_id:
                copies[h["_id"]] = copy
        return copies

    def _copy(self, hit: dict[str, Any]) -> EsCopy:
        parsed = parse_index_name(self.settings, hit["_index"])
        return EsCopy(
            tenant_id=hit["_source"].get("tenant_id", ""),
            version=int(hit["_source"].get("version", 0)),
            stored_fingerprint=int(hit["_source"].get("fingerprint", -1)),
            fields_fingerprint=fingerprint_of_source(hit["_id"], hit["_source"]),
            es_version=int(hit.get("_version", 0)),
            index_tenant=parsed.tenant_id if parsed else None,
        )

    # -- reindex

    def start_reindex(self, tenant_id: str | None = None) -> ReindexStart:
        """The generation a reindex in progress is building, or a new one marked as being
        built (from then on the relay dual-writes to it), with the last chunk id copied into
        it. Leftovers of an earlier run are deleted first: chunk indices behind no alias (a
        switch that stopped before it deleted the old indices) and the half-built index of a
        shared-layout reindex.

        With ``tenant_id`` the generation rebuilds that tenant's index only (its anchor
        records the tenant; the relay dual-writes that tenant's changes only). That needs the
        per-tenant layout, and a generation in progress for other tenants (every tenant, or
        another one) is finished first: ReindexOfAnotherScope otherwise.

        A generation in progress whose anchor records another shape than this process is
        configured with (CONCORD_ES_SHARDS, CONCORD_ES_REPLICAS, CONCORD_LEXICAL_ANALYSIS or
        CONCORD_ES_TEXT_ANALYZER changed since it started) is discarded and a new one
        started: resumed, it would switch to indices unlike the configured ones. Only the
        copying done so far is lost; Postgres holds every chunk. The caller holds the
        reindex lock (shared/reconcile/reindex.py): no other run switches to the generation
        discarded here."""
        if tenant_id is not None and not self.layout(fresh=True).per_tenant:
            raise ReindexOfAnotherScope(
                "the chunk index is still in the shared layout (one index for every tenant); "
                "run `concord reindex` without --tenant once to give each tenant its own index"
            )
        generation = self.reindex_target()
        discarded = None
        if generation is not None:
            anchor = self._anchor(generation)
            building = anchor["mappings"].get("_meta", {}).get(REINDEX_TENANT)
            if building != tenant_id:
                raise ReindexOfAnotherScope(
                    f"an interrupted reindex of {_scope(building)} waits to be resumed; run "
                    f"`concord reindex{_scope_option(building)}` to finish it first"
                )
            differences = self._differences_from_configured(_shape_of(anchor))
            if not differences:
                self._delete_dead_indices(keep=generation)
                progress = str(anchor["mappings"].get("_meta", {}).get(REINDEX_PROGRESS, ""))
                return ReindexStart(generation, progress, resumed=True)
            discarded = f"generation {generation} was being built with {', '.join(differences)}"
            log.warning("reindex: %s; discarded, starting again", discarded)
        self._delete_dead_indices(keep=None)  # a discarded generation is behind no read alias
        generation = new_generation()
        self._create(
            anchor_index(self.settings, generation),
            {reindexing_alias(self.settings): {}},
            meta={REINDEX_TENANT: tenant_id} if tenant_id is not None else None,
        )
        return ReindexStart(generation, "", resumed=False, started_again_because=discarded)

    def _differences_from_configured(self, made: dict[str, Any]) -> list[str]:
        return [
            f"CONCORD_{name.upper()}={made[name]} (configured now: {getattr(self.settings, name)})"
            for name in GENERATION_SHAPE
            if name in made and made[name] != getattr(self.settings, name)
        ]

    def _delete_dead_indices(self, keep: str | None) -> list[str]:
        """Delete the chunk indices that nothing reads or writes: behind neither the read
        alias nor of the generation ``keep`` being built."""
        prefix = chunks_prefix(self.settings)
        try:
            every = self.es.indices.get_alias(index=f"{prefix}*")
        except NotFoundError:
            return []
        dead = []
        for index, held in every.items():
            parsed = parse_index_name(self.settings, index)
            if self.alias in held["aliases"] or (parsed and parsed.generation == keep):
                continue
            dead.append(index)
        for index in dead:
            self.es.indices.delete(index=index)
            _existing.discard(index)
            log.info("deleted chunk index %s: behind no alias", index)
        return dead

    def copy_to(self, generation: str, chunks: Iterable[tuple[Chunk, Document]]) -> None:
        """Copies of ``chunks`` into their tenants' indices of ``generation``, at their
        versions: one a dual write already put there at a newer version stays."""
        actions = []
        for chunk, doc in chunks:
            index = self._ensure_generation_index(generation, chunk.tenant_id)
            actions.append(
                {
                    "_index": index,
                    "_id": chunk.id,
                    "version": chunk.version,
                    "version_type": "external",
                    "_source": es_document(chunk, doc),
                }
            )
        for attempt in range(1, COPY_ATTEMPTS + 1):
            _, errors = helpers.bulk(self.es, actions, raise_on_error=False, chunk_size=1000)
            refused = _refused_copies(errors)
            if not refused:
                return
            busy = {i for i, status in refused.items() if status == 429 or status >= 500}
            if busy != refused.keys() or attempt == COPY_ATTEMPTS:
                example = next(iter(sorted(refused.items())))
                raise ReindexCopyRefused(
                    f"Elasticsearch refused {len(refused)} copies of this page (e.g. {example[0]}:"
                    f" {example[1]}); the generation is not switched to, a run resumes here"
                )
            actions = [a for a in actions if a["_id"] in busy]
            time.sleep(COPY_BACKOFF_S * attempt)

    def mark_reindex_progress(self, generation: str, last_id: str) -> None:
        """Every chunk up to ``last_id`` is copied: an interrupted reindex resumes after it."""
        meta = {**self._anchor(generation)["mappings"].get("_meta", {}), REINDEX_PROGRESS: last_id}
        self.es.indices.put_mapping(index=anchor_index(self.settings, generation), meta=meta)

    def finish_reindex(self, generation: str) -> list[str]:
        """Switch to ``generation`` in one atomic ``update_aliases`` call (the read alias and
        every tenant's alias move to its indices; the dual writes end), then delete the
        indices of the generations before; returns their names. A tenant whose live index
        has no counterpart in ``generation`` (it holds no chunk now) gets an empty one, so
        no tenant's alias ever disappears. A tenant's first index, created in the old
        generation while this ran, makes the switch fail (Elasticsearch answers 400 or 500 for
        an alias with two write indices): it is computed again, once.

        A generation that rebuilds one tenant moves that tenant's aliases only; its anchor,
        which no alias reads, goes with the tenant's old index."""
        rebuilt = self._generation_tenant(generation)
        for attempt in (1, 2):
            try:
                old = (
                    self._switch_to(generation)
                    if rebuilt is None
                    else self._switch_tenant_to(generation, rebuilt)
                )
                break
            except ApiError:  # 400 or 500: a second write index for a tenant's alias
                if attempt == 2:
                    raise
        _layout.pop(self.alias, None)
        old += self._delete_dead_indices(keep=None)  # the old ones, and any late straggler
        return sorted(set(old))

    def _switch_to(self, generation: str) -> list[str]:
        prefix = chunks_prefix(self.settings)
        built = list(self.es.indices.get(index=f"{prefix}{generation}-*"))
        built_tenants = {
            parsed.tenant_id
            for name in built
            if (parsed := parse_index_name(self.settings, name)) and parsed.tenant_id
        }
        every = self.es.indices.get_alias(index=f"{prefix}*")
        live = {index: held for index, held in every.items() if self.alias in held["aliases"]}
        for name in live:
            parsed = parse_index_name(self.settings, name)
            if parsed and parsed.tenant_id and parsed.tenant_id not in built_tenants:
                built.append(self._ensure_generation_index(generation, parsed.tenant_id))
        self.es.indices.refresh(index=f"{prefix}{generation}-*")
        actions: list[dict[str, Any]] = [
            {"remove": {"index": index, "alias": name}}
            for index, held in live.items()
            for name in held["aliases"]
        ]
        for index in built:
            parsed = parse_index_name(self.settings, index)
            if parsed is None:
                continue
            actions.append({"add": {"index": index, "alias": self.alias}})
            if parsed.tenant_id:
                alias = tenant_alias(self.settings, parsed.tenant_id)
                actions.append({"add": {"index": index, "alias": alias, "is_write_index": True}})
        actions.append(
            {
                "remove": {
                    "index": anchor_index(self.settings, generation),
                    "alias": reindexing_alias(self.settings),
                }
            }
        )
        self.es.indices.update_aliases(actions=actions)
        return list(live)

    def _switch_tenant_to(self, generation: str, tenant_id: str) -> list[str]:
        alias = tenant_alias(self.settings, tenant_id)
        built = self._ensure_generation_index(generation, tenant_id)  # made even if empty
        try:
            live = list(self.es.indices.get_alias(name=alias))
        except NotFoundError:
            live = []  # the tenant had no index yet: it gets the rebuilt one
        self.es.indices.refresh(index=built)
        actions: list[dict[str, Any]] = [
            {"remove": {"index": index, "alias": name}}
            for index in live
            for name in (alias, self.alias)
        ]
        actions += [
            {"add": {"index": built, "alias": self.alias}},
            {"add": {"index": built, "alias": alias, "is_write_index": True}},
            {
                "remove": {
                    "index": anchor_index(self.settings, generation),
                    "alias": reindexing_alias(self.settings),
                }
            },
        ]
        self.es.indices.update_aliases(actions=actions)
        return live


def _scope(tenant_id: str | None) -> str:
    return "every tenant" if tenant_id is None else f"tenant {tenant_id}"


def _scope_option(tenant_id: str | None) -> str:
    return "" if tenant_id is None else f" --tenant {tenant_id}"


if TYPE_CHECKING:  # mypy proves the adapter implements every port
    _implements: ChunkIndex = ElasticsearchChunkIndex()
