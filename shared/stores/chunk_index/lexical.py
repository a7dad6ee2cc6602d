"""The search's lexical arm: BM25 within one tenant, in that tenant's own index (its scores
come from its own documents only), and the tenant's term statistics. The match query and the
tenant filter are built here, from the query text and the request's filters, so no caller can
search another tenant's copies or put user text into anything but a ``multi_match``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from elasticsearch import BadRequestError, NotFoundError

from shared.metrics import LEXICAL_ANALYSIS_FALLBACKS
from shared.settings import LexicalAnalysis
from shared.stores import english_analysis
from shared.stores.chunk_index.base import IndexBase
from shared.stores.elastic import raises_store_errors
from shared.stores.filters import Filters, es_filters

log = logging.getLogger(__name__)

# Per process: the analysis each tenant's index was last found to index, where that is not the
# configured one (an index made before CONCORD_LEXICAL_ANALYSIS changed): its searches go
# straight to those fields instead of failing first, and it is logged once.
_found_analysis: dict[str, LexicalAnalysis] = {}


@raises_store_errors
class IndexLexicalSearch(IndexBase):
    """LexicalSearch (shared/stores/ports.py)."""

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
                # The chunk id from its doc values, not the stored _id: the fetch phase then
                # reads no stored field, which for 100 hits was most of the request (SciFact,
                # 11k chunks, size 100: 13.6 ms p50 through the client with _id, 6.3 with doc
                # values; size 10: 5.5 ms). Every copy holds chunk_id (chunk_document.py).
                stored_fields=["_none_"],
                docvalue_fields=[{"field": "chunk_id"}],
                # Several shards a tenant: their statistics pooled first, so that BM25 scores
                # are those of all the tenant's documents, as with one shard. Asked of every
                # index whatever CONCORD_ES_SHARDS says now (an index keeps the shards it was
                # made with until a reindex): Elasticsearch skips the extra round for a search
                # that meets one shard (SciFact, one shard: 3.9 ms p50 with it, 3.8 without).
                search_type="dfs_query_then_fetch",
            )
        except NotFoundError:  # no copy of this tenant was ever written
            return []
        return [
            (hit["fields"]["chunk_id"][0], float(hit["_score"])) for hit in response["hits"]["hits"]
        ]

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
