"""Retrieve: the query's vector and both arms' hits (dense from pgvector, BM25 from
Elasticsearch), each arm degrading alone.

The lexical arm needs no vector: Elasticsearch works on it (on a pool thread) while the query
is encoded on the request's thread, and the dense arm then runs on the request's thread too,
in the search's read transaction (a tenant whose reads Postgres is slow to answer holds its
own requests' threads, never a pool every search shares)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache

from shared.errors import StoreError, StoreUnavailable
from shared.ingest.embedding import get_embedder
from shared.search.coverage import CorpusCounts, QueryTerms
from shared.search.schemas import SearchRequest
from shared.search.values import Arms, Query
from shared.settings import Settings
from shared.stores.ports import LexicalSearch, VectorSearch
from shared.stores.schemas import ArmHit
from shared.timing import StageTimes

log = logging.getLogger(__name__)

# Each lexical request ends within the client's timeout (``es_request_timeout_s``), and a
# search waits for it at most ``search_store_timeout_s`` (plus a margin: an error says more
# than a wait that ran out).
_lexical_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="search-lexical")
ARM_WAIT_MARGIN_S = 1.0
ARM_ERRORS = (StoreError,)  # the adapters raise Concord's store errors, never a driver's
# Dense arms one tenant may run at once in this process: a tenant whose searches Postgres is
# slow to answer holds at most this many of the process's connections (15), not all of them.
DENSE_ARMS_PER_TENANT = 4
_dense_slots: dict[str, threading.BoundedSemaphore] = {}
_dense_slots_guard = threading.Lock()
# The encoder's threads for a query: every core when Elasticsearch has no part in the search
# (a dense-only one: 2.6 ms a SciFact query on two threads, 4.0 on one), one otherwise (the
# lexical arm runs on the other core meanwhile, and two threads slowed both).
ALL_CORES = max(1, min(2, os.cpu_count() or 1))


def retrieve(
    query: Query, *, index: LexicalSearch, vectors: VectorSearch, timings: StageTimes
) -> Arms:
    """Both arms (the lexical one beside the query's encoding), each degrading alone; a 503
    when neither answers."""
    tenant_id, request, settings = query.tenant_id, query.request, query.settings
    lexical: Future[list[ArmHit]] | None = None
    dense: list[ArmHit] | Exception | None = None
    with timings.stage("retrieve"):
        if request.mode in ("lexical", "hybrid"):
            lexical = _lexical_pool.submit(
                timings.timed, "lexical", lambda: lexical_arm(index, tenant_id, request)
            )
        # The corpus's count of each question term: the weights of the passages' and titles'
        # ordering, whatever decides, and the default decision's term coverage.
        terms = QueryTerms.of(request.query)
        counting: Future[CorpusCounts | None] | None = None
        if terms.stems:
            counting = _lexical_pool.submit(
                timings.timed, "term_counts", lambda: corpus_counts(index, tenant_id, terms)
            )
        lexical_deadline = time.monotonic() + settings.search_store_timeout_s + ARM_WAIT_MARGIN_S
        threads = ALL_CORES if request.mode == "dense" else 1
        vector = timings.timed(
            "embed",
            lambda: query_vector(
                request.query, settings, threads, cached=query.embedding_cache, scope=tenant_id
            ),
        )
        if request.mode in ("dense", "hybrid"):
            dense = _dense_within_slot(query, vectors, timings, vector)
        hits: dict[str, list[ArmHit]] = {}
        degraded: list[str] = []
        if lexical is not None:
            try:
                hits["lexical"] = lexical.result(
                    timeout=max(0.0, lexical_deadline - time.monotonic())
                )
            except (*ARM_ERRORS, FutureTimeout) as e:
                lexical.cancel()  # one still waiting for a thread need not run at all
                degraded.append(_arm_unavailable("lexical", e))
        if isinstance(dense, Exception):
            degraded.append(_arm_unavailable("dense", dense))
        elif dense is not None:
            hits["dense"] = dense
        counts = None
        if counting is not None:
            try:
                counts = counting.result(timeout=max(0.0, lexical_deadline - time.monotonic()))
            except (*ARM_ERRORS, FutureTimeout) as e:
                counting.cancel()
                log.warning("term counts unavailable: %s: %s", type(e).__name__, e)
                counts = CorpusCounts.unknown()
    if not hits:
        raise StoreUnavailable("neither Postgres nor Elasticsearch answered the search")
    return Arms(hits, degraded, vector, counts)


def corpus_counts(index: LexicalSearch, tenant_id: str, terms: QueryTerms) -> CorpusCounts | None:
    counted = index.term_counts(tenant_id, list(terms.stems))
    return None if counted is None else CorpusCounts(*counted)


def dense_arm(
    vectors: VectorSearch,
    tenant_id: str,
    vector: list[float],
    *,
    request: SearchRequest,
    within_s: float | None = None,
) -> list[ArmHit]:
    """The pgvector arm: the request's dense candidates, nearest first."""
    hits = vectors.nearest(
        tenant_id, vector, request.candidate_depth.dense, request.filters, within_s=within_s
    )
    return [ArmHit(cid, rank, cosine) for rank, (cid, cosine) in enumerate(hits, start=1)]


def lexical_arm(index: LexicalSearch, tenant_id: str, request: SearchRequest) -> list[ArmHit]:
    """The BM25 arm; the chunk index builds the query (user text only in a match query)."""
    hits = index.lexical_search(
        tenant_id,
        request.query,
        request.filters,
        request.candidate_depth.lexical,
        field_boosts=request.lexical.field_boosts,
        tie_breaker=request.lexical.tie_breaker,
    )
    return [ArmHit(chunk_id, rank, score) for rank, (chunk_id, score) in enumerate(hits, start=1)]


def _dense_within_slot(
    query: Query, vectors: VectorSearch, timings: StageTimes, vector: list[float]
) -> list[ArmHit] | Exception:
    """The dense arm's hits, or why there are none: the store's error, or the tenant's slots
    all taken. Waiting for a slot and the query share one ``search_store_timeout_s`` (the
    store ends its search within what is left, and leaves the read transaction usable)."""
    limit = query.settings.search_store_timeout_s
    deadline = time.monotonic() + limit
    slot = _dense_slot(query.tenant_id)
    if not slot.acquire(timeout=limit):
        return TimeoutError(f"{DENSE_ARMS_PER_TENANT} dense searches of the tenant still running")
    try:
        left = deadline - time.monotonic()
        if left <= 0:
            return TimeoutError("no time left for the dense arm after waiting for a slot")
        return timings.timed(
            "dense",
            lambda: dense_arm(
                vectors, query.tenant_id, vector, request=query.request, within_s=left
            ),
        )
    except ARM_ERRORS as e:
        return e
    finally:
        slot.release()


def _dense_slot(tenant_id: str) -> threading.BoundedSemaphore:
    with _dense_slots_guard:
        slot = _dense_slots.get(tenant_id)
        if slot is None:
            slot = _dense_slots[tenant_id] = threading.BoundedSemaphore(DENSE_ARMS_PER_TENANT)
        return slot


def _arm_unavailable(arm: str, error: Exception) -> str:
    log.warning("%s arm unavailable: %s: %s", arm, type(error).__name__, error)
    return f"{arm}_unavailable"


@lru_cache(maxsize=1)
def _query_cache(size: int) -> Callable[[str, str, int], tuple[float, ...]]:
    @lru_cache(maxsize=size)
    def embed(scope: str, query: str, threads: int) -> tuple[float, ...]:
        return tuple(get_embedder().embed_query(query, threads).tolist())

    return embed


def query_vector(
    query: str, settings: Settings, threads: int = 1, *, cached: bool = True, scope: str = ""
) -> list[float]:
    """Query embeddings are cached in a bounded LRU (repeated queries skip the encoder);
    ``cached=False`` encodes the query whatever the cache holds (a caller measuring the
    encoder's share, as concord eval does, asks for that with Cache-Control: no-cache).

    Entries are kept per ``scope`` (a search's tenant): a hit is some 3 ms faster than a miss,
    and the Server-Timing header shows it, so a shared entry would tell one tenant what
    another had searched for."""
    if not cached:
        return get_embedder().embed_query(query, threads).tolist()  # type: ignore[no-any-return]
    return list(_query_cache(settings.query_cache_size)(scope, query, threads))
