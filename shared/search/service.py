"""The query path: embed → dense (pgvector) and lexical (Elasticsearch BM25) arms, concurrently
→ fusion → hydration from Postgres → optional rerank within a time budget → MMR and a
per-document cap → evidence policy.

Every hit is hydrated from Postgres: one that Postgres does not hold at its live version is
dropped, counted and queued for repair, so the read path never serves stale or deleted text.
If one store is down, the other answers and the response lists it under ``degraded``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import TypeVar

import numpy as np
from elasticsearch import ApiError, TransportError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from shared.answerability import service as answerability
from shared.answerability.features import RERANK_WINDOW
from shared.answerability.schemas import AnswerabilityTrace
from shared.db import Transactions, UnitOfWork
from shared.db import repository as db_repo
from shared.db.replica import reads_for_search
from shared.errors import BadRequest, Conflict, NotFound, StoreUnavailable
from shared.ingest.embedding import get_embedder
from shared.metrics import (
    DEGRADED_QUERIES,
    SEARCH_READS,
    SEARCH_SECONDS,
    SEARCH_STAGE_SECONDS,
    STALE_HITS_DROPPED,
)
from shared.outbox.service import queue_stale_copy_purges
from shared.profiles.service import resolve_profile
from shared.rerankers import service as rerankers
from shared.rerankers.scoring import (
    RerankUnavailable,
    get_reranker,
    get_trained_reranker,
    rerank_passage,
    rerank_within_budget,
)
from shared.search import cursors
from shared.search.boost import boosted
from shared.search.cursors import Retrieved
from shared.search.fusion import ArmHit, fuse
from shared.search.highlights import highlight, query_terms
from shared.search.policy import Candidate, PolicyConfig, PolicyResult, apply_policy
from shared.search.schemas import (
    Boost,
    DocumentGroup,
    Evidence,
    RankScore,
    RerankTrace,
    SearchRequest,
    SearchResponse,
    SearchResult,
    Trace,
)
from shared.settings import Settings, get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.schemas import document_of_chunk
from shared.stores.vector_store import PgVectorStore
from shared.timing import StageTimes
from shared.vector_type import vector_from_bytes

log = logging.getLogger(__name__)

# The lexical arm runs beside the query's encoding, on a pool of its own; each of its requests
# ends within the client's timeout (``es_request_timeout_s``), and a search waits for it at
# most ``search_store_timeout_s`` (plus a margin: an error says more than a wait that ran
# out). The dense arm runs on the request's thread, under Postgres' statement timeout.
_lexical_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="search-lexical")
ARM_WAIT_MARGIN_S = 1.0
ARM_ERRORS = (ApiError, TransportError, SQLAlchemyError)
# Dense arms one tenant may run at once in this process: a tenant whose searches Postgres is
# slow to answer holds at most this many of the process's connections (15), not all of them.
DENSE_ARMS_PER_TENANT = 4
_dense_slots: dict[str, threading.BoundedSemaphore] = {}
_dense_slots_guard = threading.Lock()


def _dense_slot(tenant_id: str) -> threading.BoundedSemaphore:
    with _dense_slots_guard:
        slot = _dense_slots.get(tenant_id)
        if slot is None:
            slot = _dense_slots[tenant_id] = threading.BoundedSemaphore(DENSE_ARMS_PER_TENANT)
        return slot


T = TypeVar("T")
EMPTY_SCORES: Mapping[str, float] = {}
# Results hydrated with their embeddings: more than a default token budget packs; the policy
# reads the rest's only if it gets to them (reading all 100 of a 100-result search cost 1 ms).
EMBEDDINGS_UP_FRONT = 24


@lru_cache(maxsize=1)
def _query_cache(size: int) -> Callable[[str, str, int], tuple[float, ...]]:
    @lru_cache(maxsize=size)
    def embed(scope: str, query: str, threads: int) -> tuple[float, ...]:
        return tuple(get_embedder().embed_query(query, threads).tolist())

    return embed


def query_vector(
    query: str, settings: Settings, threads: int = 1, cached: bool = True, scope: str = ""
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


# The encoder's threads for a query: every core when Elasticsearch has no part in the search
# (a dense-only one: 2.6 ms a SciFact query on two threads, 4.0 on one), one otherwise (the
# lexical arm runs on the other core meanwhile, and two threads slowed both).
ALL_CORES = max(1, min(2, os.cpu_count() or 1))


def dense_arm(
    reads: Transactions,
    tenant_id: str,
    vector: list[float],
    request: SearchRequest,
    settings: Settings,
) -> list[ArmHit]:
    """The pgvector arm, in a transaction of its own (it runs on a thread of its own)."""
    with reads() as uow:
        hits = PgVectorStore(uow.session, settings).nearest(
            tenant_id, vector, request.candidate_depth.dense, request.filters
        )
    return [ArmHit(cid, rank, cosine) for rank, (cid, cosine) in enumerate(hits, start=1)]


def lexical_arm(tenant_id: str, request: SearchRequest, settings: Settings) -> list[ArmHit]:
    """The BM25 arm; the chunk index builds the query (user text only in a match query)."""
    hits = ElasticsearchChunkIndex(settings=settings).lexical_search(
        tenant_id,
        request.query,
        request.filters,
        request.candidate_depth.lexical,
        field_boosts=request.lexical.field_boosts,
        tie_breaker=request.lexical.tie_breaker,
    )
    return [ArmHit(chunk_id, rank, score) for rank, (chunk_id, score) in enumerate(hits, start=1)]


@dataclass(frozen=True)
class _Query:
    """What every stage of one search needs: whose, what, with which settings, and the
    boundary's transactions (each stage that reads Postgres opens its own: the arms run on
    threads of their own): ``reads`` for the query path's reads (the replica's, when it is
    fresh enough: shared/db/replica.py), bounded by ``search_store_timeout_s``;
    ``transactions`` for the primary."""

    tenant_id: str
    request: SearchRequest
    settings: Settings
    transactions: Transactions
    unbounded_reads: Transactions
    answerability: answerability.LoadedModel | None = None
    embedding_cache: bool = True  # False: the query is encoded even when the cache holds it

    @property
    def reads(self) -> Transactions:
        return self.reads_within(self.settings.search_store_timeout_s)

    def reads_within(self, seconds: float) -> Transactions:
        return _bounded(self.unbounded_reads, seconds)


def _answerability_model(
    session: Session, tenant_id: str, request: SearchRequest
) -> answerability.LoadedModel:
    """The tenant's answerability model the request names (404 if it has none by that name,
    or if the reranker it reads is gone; 409 if that reranker was trained again since); its
    features are both arms' scores, so only a hybrid search can use it."""
    if request.mode != "hybrid":
        raise BadRequest(
            'policy.score_type "answerability" needs mode "hybrid": the model judges both '
            f"arms' scores, and a {request.mode} search runs one"
        )
    name = request.policy.answerability_model or answerability.DEFAULT_MODEL
    judge = answerability.load(answerability.get(session, tenant_id, name))
    if judge.reranker is None:
        return judge
    try:
        files = rerankers.get(session, tenant_id, judge.reranker).path
    except NotFound as e:
        raise NotFound(
            f"answerability model {name!r} reads the scores of reranker {judge.reranker!r}, "
            "which this tenant no longer has: train the model again"
        ) from e
    if files != judge.reranker_files:
        raise Conflict(
            f"answerability model {name!r} was trained on the scores of an earlier training "
            f"of reranker {judge.reranker!r}: train the model again"
        )
    return judge


def search(
    transactions: Transactions,
    tenant_id: str,
    request: SearchRequest,
    settings: Settings | None = None,
    replica: Transactions | None = None,
    embedding_cache: bool = True,
) -> SearchResponse:
    """One search; with ``replica``, its dense search and hydration read the replica when it
    has replayed everything committed before the search began; without ``embedding_cache``,
    the query is encoded even if the query cache holds its vector."""
    settings = settings or get_settings()
    trained_reranker: str | None = None
    judge: answerability.LoadedModel | None = None
    if (
        request.profile is not None
        or request.rerank.model is not None
        or request.policy.score_type == "answerability"
    ):
        with transactions() as uow:
            if request.profile is not None:
                request = resolve_profile(uow.session, tenant_id, request)
            if request.policy.score_type == "answerability":
                judge = _answerability_model(uow.session, tenant_id, request)
            if request.rerank.enabled and request.rerank.model is not None:
                # Resolved before any store is queried: an unknown name is a 404 at once.
                entry = rerankers.get(uow.session, tenant_id, request.rerank.model)
                trained_reranker = entry.path
                if request.rerank.blend is None:
                    blend = entry.card.get("validation", {}).get("blend", 1.0)
                    request = request.model_copy(
                        update={"rerank": request.rerank.model_copy(update={"blend": blend})}
                    )
    if request.paginate and (request.rerank.enabled or request.mmr is not None):
        raise BadRequest(
            "paginate follows the fused ranking page by page; rerank and mmr reorder only a "
            "window of the first page: turn them off to paginate"
        )
    query = _Query(
        tenant_id,
        request,
        settings,
        transactions,
        _reads(transactions, replica, settings),
        judge,
        embedding_cache,
    )
    return _measured(request, lambda timings: _search(query, timings, trained_reranker))


def _reads(
    transactions: Transactions, replica: Transactions | None, settings: Settings
) -> Transactions:
    """The transactions the search's reads use (the replica's when it is fresh enough),
    counted by where they go."""
    reads, source = reads_for_search(transactions, replica, settings)
    SEARCH_READS.labels(source).inc()
    return reads


def _bounded(transactions: Transactions, seconds: float) -> Transactions:
    """``transactions`` whose statements Postgres cancels after ``seconds``: a search that
    meets a locked or overloaded Postgres fails (503) or degrades instead of holding its
    threads and connections for as long as the store takes."""

    @contextmanager
    def bounded() -> Iterator[UnitOfWork]:
        with transactions() as uow:
            db_repo.limit_statements(uow.session, seconds)
            yield uow

    return bounded


def _measured(
    request: SearchRequest, run: Callable[[StageTimes], SearchResponse]
) -> SearchResponse:
    """One search (a first page or a later one) under the search metrics."""
    timings = StageTimes(scale=1e3, digits=3)  # milliseconds
    with SEARCH_SECONDS.labels(request.mode).time():
        response = run(timings)
    response._stage_ms = timings.totals
    for stage, ms in timings.totals.items():
        SEARCH_STAGE_SECONDS.labels(stage).observe(ms / 1e3)
    for reason in response.degraded:
        DEGRADED_QUERIES.labels(reason).inc()
    STALE_HITS_DROPPED.inc(response.dropped_stale)
    return response


def _search(query: _Query, timings: StageTimes, trained_reranker: str | None) -> SearchResponse:
    retrieved = _retrieve(query, timings)
    if query.request.paginate and query.request.per_document_cap is not None:
        # The cap holds across pages: the ranking pages are cut from is capped once.
        capped = _within_cap(
            retrieved.fused, query.request.per_document_cap, lambda hit: document_of_chunk(hit[0])
        )
        retrieved = replace(retrieved, fused=capped)
    return _respond(query, timings, retrieved, trained_reranker)


def _retrieve(query: _Query, timings: StageTimes) -> Retrieved:
    """Both arms (concurrently, each degrading alone) and their fused ranking."""
    tenant_id, request, settings = query.tenant_id, query.request, query.settings
    lexical: Future[list[ArmHit]] | None = None
    dense: list[ArmHit] | Exception | None = None
    with timings.stage("retrieve"):
        # BM25 needs no vector: Elasticsearch works on it while this thread embeds the query.
        # That pays on 2 cores because the ONNX query encoder keeps to one thread (torch on
        # two was slowed by the overlap more than it saved: p50 79 ms embedding first vs 100).
        if request.mode in ("lexical", "hybrid"):
            lexical = _lexical_pool.submit(
                _timed_arm, timings, "lexical", lambda: lexical_arm(tenant_id, request, settings)
            )
        lexical_deadline = time.monotonic() + settings.search_store_timeout_s + ARM_WAIT_MARGIN_S
        threads = ALL_CORES if request.mode == "dense" else 1
        vector = timings.timed(
            "embed",
            lambda: query_vector(
                request.query, settings, threads, query.embedding_cache, scope=tenant_id
            ),
        )
        if request.mode in ("dense", "hybrid"):
            # On this request's own thread: a tenant whose reads Postgres is slow to answer
            # holds its own requests' threads, never a pool every search shares.
            dense = _dense_within_slot(query, timings, vector)
        arms: dict[str, list[ArmHit]] = {}
        degraded: list[str] = []
        if lexical is not None:
            try:
                arms["lexical"] = lexical.result(
                    timeout=max(0.0, lexical_deadline - time.monotonic())
                )
            except (*ARM_ERRORS, FutureTimeout) as e:
                lexical.cancel()  # one still waiting for a thread need not run at all
                degraded.append(_arm_unavailable("lexical", e))
        if isinstance(dense, Exception):
            degraded.append(_arm_unavailable("dense", dense))
        elif dense is not None:
            arms["dense"] = dense
    if not arms:
        raise StoreUnavailable("neither Postgres nor Elasticsearch answered the search")
    fused = timings.timed("fuse", lambda: fuse(arms, request.fusion))
    boost = request.boost
    if boost is not None:
        fused = timings.timed("boost", lambda: _boost(query, fused, boost))
    return Retrieved(arms, degraded, vector, fused)


def _dense_within_slot(
    query: _Query, timings: StageTimes, vector: list[float]
) -> list[ArmHit] | Exception:
    """The dense arm's hits, or why there are none: the store's error, or the tenant's slots
    all taken. Waiting for a slot and the query share one ``search_store_timeout_s``."""
    deadline = time.monotonic() + query.settings.search_store_timeout_s
    slot = _dense_slot(query.tenant_id)
    if not slot.acquire(timeout=query.settings.search_store_timeout_s):
        return TimeoutError(f"{DENSE_ARMS_PER_TENANT} dense searches of the tenant still running")
    try:
        left = deadline - time.monotonic()
        if left <= 0:
            return TimeoutError("no time left for the dense arm after waiting for a slot")
        reads = query.reads_within(left)  # what is left of the wait, not all of it again
        return _timed_arm(
            timings,
            "dense",
            lambda: dense_arm(reads, query.tenant_id, vector, query.request, query.settings),
        )
    except ARM_ERRORS as e:
        return e
    finally:
        slot.release()


def _arm_unavailable(arm: str, error: Exception) -> str:
    log.warning("%s arm unavailable: %s: %s", arm, type(error).__name__, error)
    return f"{arm}_unavailable"


def _boost(query: _Query, fused: list[tuple[str, float]], boost: Boost) -> list[tuple[str, float]]:
    """The fused ranking lifted by a metadata boost (the values read from Postgres for every
    fused candidate, in one query)."""
    with query.reads() as uow:
        values = PgVectorStore(uow.session, query.settings).metadata_values(
            query.tenant_id, [cid for cid, _ in fused], boost.field
        )
    return boosted(fused, values, boost, datetime.now(UTC))


def _respond(
    query: _Query,
    timings: StageTimes,
    retrieved: Retrieved,
    trained_reranker: str | None,
    offset: int = 0,
    cursor_id: str | None = None,
) -> SearchResponse:
    """The page of results from ``offset`` in the fused ranking (0: the first), reranked,
    diversified, judged by the policy and shaped as the request asks."""
    request, settings = query.request, query.settings
    arms, vector, fused = retrieved.arms, retrieved.vector, retrieved.fused
    degraded = list(retrieved.degraded)
    cosines = {hit.chunk_id: hit.score for hit in arms.get("dense", [])}
    with timings.stage("hydrate"):
        candidates, dropped = _hydrate_enough(query, fused[offset:], vector, cosines)
    hydrated = candidates  # in fused order, before a rerank reorders them
    by_arm = {arm: {h.chunk_id: h for h in hits} for arm, hits in arms.items()}
    fused_rank = {cid: (rank, score) for rank, (cid, score) in enumerate(fused, start=1)}

    rerank_info: dict[str, tuple[float, int]] = {}
    if request.rerank.enabled:
        with timings.stage("rerank"):
            candidates, rerank_info, rerank_error = _rerank(
                request, candidates, settings, trained_reranker, dict(fused)
            )
        if rerank_error:
            degraded.append("rerank_unavailable")
    judged = (
        timings.timed(
            "answerability",
            lambda: _judge(query, retrieved, hydrated, offset, trained_reranker, rerank_info),
        )
        if query.answerability is not None
        else None
    )
    if request.mmr is not None:
        with timings.stage("mmr"):
            # Diversify within a window of the best candidates, not all of them.
            window = candidates[: settings.search_candidate_window]
            _attach_embeddings(query, window)
            candidates = _mmr(window, request.mmr.lambda_, request.top_k, request.per_document_cap)
    results = _cap_per_document(candidates, request.per_document_cap)[: request.top_k]

    with timings.stage("policy"):
        policy = apply_policy(
            results,
            _policy_config(request, settings, bool(rerank_info), judged),
            _TokenizerCounter(),
            dropped_before=dropped,
            # Near-duplicate suppression compares the embeddings of the results it considers
            # while the budget lasts; those not hydrated with them are read when it gets there.
            load_embeddings=lambda some: _attach_embeddings(query, some),
        )
    items = []
    terms = query_terms(request.query) if request.highlight else frozenset()
    for final_rank, c in enumerate(results, start=1):
        item = _result(c, by_arm, fused_rank)
        if request.highlight:
            item.highlights = highlight(c.text, terms)
        if request.explain:
            item.trace = _trace(c, final_rank, by_arm, fused_rank, rerank_info, policy)
        items.append(item)
    response = SearchResponse(
        query=request.query,
        mode=request.mode,
        degraded=degraded,
        dropped_stale=dropped,
        decision=policy.decision(),
        results=items,
        evidence=Evidence(
            items=policy.evidence,
            token_budget=policy.token_budget,
            tokens_used=policy.tokens_used,
            omitted=policy.omitted,
        ),
    )
    if request.group_by == "document":
        response.groups = group_by_document(items)
    if request.paginate:
        response.next_cursor = _next_cursor(query, retrieved, offset, results, cursor_id)
    if request.explain:
        response.timings_ms = timings.totals
    return response


def _next_cursor(
    query: _Query,
    retrieved: Retrieved,
    offset: int,
    results: list[Candidate],
    cursor_id: str | None,
) -> str | None:
    """Where the next page starts (past this page's last result), or None at the end; the
    ranking is stored with the first page's cursor, and later pages reuse it."""
    if len(results) < query.request.top_k:
        return None  # the ranking ran out (or the hydration budget did): nothing after this
    position = {cid: i for i, (cid, _) in enumerate(retrieved.fused)}
    following = max(position[c.chunk_id] for c in results) + 1
    if following >= len(retrieved.fused):
        return None
    if cursor_id is None:
        cursor_id = cursors.save(query.settings, query.tenant_id, query.request, retrieved)
    return cursors.encode(cursor_id, following)


def search_next_page(
    transactions: Transactions,
    tenant_id: str,
    cursor: str,
    settings: Settings | None = None,
    replica: Transactions | None = None,
) -> SearchResponse:
    """The page after the one ``cursor`` came with: from the stored ranking, hydrated now."""
    settings = settings or get_settings()
    cursor_id, offset = cursors.decode(cursor)
    request, retrieved = cursors.load(settings, tenant_id, cursor_id)
    judge = None
    if request.policy.score_type == "answerability":
        with transactions() as uow:
            judge = _answerability_model(uow.session, tenant_id, request)
    query = _Query(
        tenant_id, request, settings, transactions, _reads(transactions, replica, settings), judge
    )
    return _measured(
        request, lambda timings: _respond(query, timings, retrieved, None, offset, cursor_id)
    )


def group_by_document(results: list[SearchResult]) -> list[DocumentGroup]:
    """The results by document: documents in the order of their best result (the results are
    in rank order), each with its results in rank order."""
    groups: dict[str, DocumentGroup] = {}
    for r in results:
        group = groups.get(r.document_id)
        if group is None:
            group = groups[r.document_id] = DocumentGroup(
                document_id=r.document_id,
                external_id=r.external_id,
                title=r.title,
                score=r.score,
                results=[],
            )
        group.results.append(r)
    return list(groups.values())


def _judge(
    query: _Query,
    retrieved: Retrieved,
    hydrated: list[Candidate],
    offset: int,
    trained_reranker: str | None,
    rerank_info: dict[str, tuple[float, int]],
) -> AnswerabilityTrace | None:
    """The model's judgement of the query from both arms' scores (and, for a model that reads
    a reranker, that reranker's scores of the first results in fused order); None if an arm
    or the reranker was unavailable (the policy then asks for verification, not a guess)."""
    model, arms = query.answerability, retrieved.arms
    if model is None or set(arms) != {"dense", "lexical"}:
        return None
    rerank_scores: list[float] | None = None
    if model.reranker is not None:
        first = _first_live_results(query, retrieved, hydrated if offset == 0 else [])
        rerank_scores = _first_results_scores(query, first, trained_reranker, rerank_info)
        if rerank_scores is None:
            return None
    o = query.request.policy
    return model.judge(
        query.request.query,
        arms["dense"],
        arms["lexical"],
        document_of_chunk,
        abstain_below=o.min_score,
        verify_below=o.verify_below,
        rerank_scores=rerank_scores,
    )


def _first_live_results(
    query: _Query, retrieved: Retrieved, hydrated: list[Candidate]
) -> list[Candidate]:
    """The first RERANK_WINDOW live chunks of the ranking the search serves from (fused, then
    boosted or, for a paginated search, capped per document, as the request asks): the same
    on every page and for any top_k. Taken from the page's hydrated candidates when they hold
    them all, else hydrated here. The model trained on those of a default request."""
    window = [cid for cid, _ in retrieved.fused[:RERANK_WINDOW]]
    by_id = {c.chunk_id: c for c in hydrated}
    if all(cid in by_id for cid in window):
        return [by_id[cid] for cid in window]
    # Twice the window: room for stale hits, which are dropped as the page's own are.
    live, _ = _hydrate(query, retrieved.fused[: 2 * RERANK_WINDOW], retrieved.vector, [])
    return live[:RERANK_WINDOW]


def _first_results_scores(
    query: _Query,
    first_results: list[Candidate],
    trained_reranker: str | None,
    rerank_info: dict[str, tuple[float, int]],
) -> list[float] | None:
    """The answerability model's reranker's scores of ``first_results``: the rerank stage's
    when it ran that reranker over all of them, else scored here (within the rerank budget)."""
    assert query.answerability is not None and query.answerability.reranker_files is not None
    files = query.answerability.reranker_files  # checked against the registry: the live one
    if trained_reranker == files and all(c.chunk_id in rerank_info for c in first_results):
        return [rerank_info[c.chunk_id][0] for c in first_results]
    try:
        reranker = get_trained_reranker(files, query.settings)
        return rerank_within_budget(
            reranker,
            query.request.query,
            [rerank_passage(c.title, c.text) for c in first_results],
            query.request.rerank.budget_ms,
        )
    except Exception as e:  # a reranker that cannot load or score must not fail the search
        log.warning("answerability reranker unavailable: %s: %s", type(e).__name__, e)
        return None


def _timed_arm(timings: StageTimes, name: str, fn: Callable[[], T]) -> T:
    return timings.timed(name, fn)


def _hydrate_enough(
    query: _Query,
    fused: list[tuple[str, float]],
    vector: list[float],
    cosines: Mapping[str, float] = EMPTY_SCORES,
) -> tuple[list[Candidate], int]:
    """Hydrate the fused list in slices until the final list can be filled: twice top_k (room
    for stale drops) or the rerank window at first, more only while a per-document cap leaves
    fewer than top_k results, and never past ``search_candidate_window`` candidates or
    ``search_hydrate_budget_ms`` (a cap of one per document over a corpus of few documents
    would otherwise hydrate every fused candidate)."""
    request, settings = query.request, query.settings
    deadline = time.monotonic() + settings.search_hydrate_budget_ms / 1000
    step = max(request.top_k * 2, request.rerank.window if request.rerank.enabled else 0, 20)
    # Without rerank or MMR reordering them, the results are (unless some are stale) the first
    # top_k fused chunks within the per-document cap. Chunk ids name their document
    # (invariant: chunk ids are "<document id>:<ordinal>"), so the cap applies before
    # hydration. The first of them come with their embeddings, which the policy compares
    # while its token budget lasts (1,024 tokens: about 8 SciFact results).
    likely_results: list[str] = []
    if not request.rerank.enabled and request.mmr is None:
        fused_ids = [cid for cid, _ in fused]
        likely_results = _within_cap(fused_ids, request.per_document_cap, document_of_chunk)
        likely_results = likely_results[: request.top_k]
    candidates: list[Candidate] = []
    dropped = 0
    hydrated: set[str] = set()
    if likely_results:
        # Those alone, first: when all of them are live they are the results, and nothing
        # past them needs its text read (a 100-result search read 200 rows before).
        wanted = set(likely_results)
        candidates, dropped = _hydrate(
            query,
            [hit for hit in fused if hit[0] in wanted],
            vector,
            likely_results[:EMBEDDINGS_UP_FRONT],
            cosines,
        )
        hydrated = wanted
        if len(candidates) == len(likely_results):  # none stale: nothing else can be a result
            return candidates, dropped
    for start in range(0, len(fused), step):
        part = [hit for hit in fused[start : start + step] if hit[0] not in hydrated]
        more, stale = _hydrate(query, part, vector, likely_results[:EMBEDDINGS_UP_FRONT], cosines)
        candidates += more
        dropped += stale
        capped = _cap_per_document(candidates, request.per_document_cap)
        if request.per_document_cap is None or len(capped) >= request.top_k:
            break
        if len(candidates) >= settings.search_candidate_window or time.monotonic() > deadline:
            break
    if hydrated:  # back in the fused order
        position = {cid: i for i, (cid, _) in enumerate(fused)}
        candidates.sort(key=lambda c: position[c.chunk_id])
    return candidates, dropped


def _hydrate(
    query: _Query,
    fused: list[tuple[str, float]],
    vector: list[float],
    embeddings_for: list[str],
    cosines: Mapping[str, float] = EMPTY_SCORES,
) -> tuple[list[Candidate], int]:
    """The live chunks among one slice of the fused list, as candidates; the hits Postgres
    does not hold live are dropped and their copies queued for purging (on the primary,
    which checks them again: a copy newer than a replica knows is never purged).

    ``cosines``: the dense arm's, by chunk id. Postgres computes the cosine again only when
    some hit lacks one (a hit of the lexical arm alone)."""
    ids = [cid for cid, _ in fused]
    known = all(cid in cosines for cid in ids)
    with query.reads() as uow:
        live = PgVectorStore(uow.session, query.settings).hydrate(
            query.tenant_id, ids, None if known else vector, embeddings_for
        )
    stale = [cid for cid in ids if cid not in live]
    if stale:
        with query.transactions() as uow:
            queue_stale_copy_purges(uow, query.settings, query.tenant_id, stale)
    candidates = []
    for cid in ids:
        row = live.get(cid)
        if row is None:
            continue
        candidates.append(
            Candidate(
                chunk_id=cid,
                document_id=str(row.document_id),
                external_id=row.external_id,
                title=row.title,
                version=row.version,
                section=row.section,
                char_start=row.char_start,
                char_end=row.char_end,
                indexed_at=row.updated_at.isoformat(),
                text=row.text,
                token_count=row.token_count,
                # The rest are loaded for the candidates that need them (_attach_embeddings).
                embedding=(None if row.embedding is None else vector_from_bytes(row.embedding)),
                scores={"dense_cosine": round(float(cosines[cid] if known else row.cosine), 6)},
                flags=list(row.flags),
                first_sentence_tokens=row.first_sentence_tokens,
            )
        )
    return candidates, len(stale)


def _attach_embeddings(query: _Query, candidates: list[Candidate]) -> None:
    missing = [c.chunk_id for c in candidates if c.embedding is None]
    if not missing:
        return
    with query.reads() as uow:
        found = PgVectorStore(uow.session, query.settings).embeddings(query.tenant_id, missing)
    for c in candidates:
        if c.embedding is None and c.chunk_id in found:
            c.embedding = found[c.chunk_id]


def _rerank(
    request: SearchRequest,
    candidates: list[Candidate],
    settings: Settings,
    trained_reranker: str | None,
    fused_scores: dict[str, float],
) -> tuple[list[Candidate], dict[str, tuple[float, int]], str | None]:
    """Rescore the first ``window`` candidates (blended with their fused scores when
    ``rerank.blend`` < 1); on any failure keep the fused order."""
    try:
        reranker = (
            get_trained_reranker(trained_reranker, settings)
            if trained_reranker
            else get_reranker(settings)
        )
    except Exception as e:  # a model that cannot load must not fail the search
        log.warning("reranker could not load: %s: %s", type(e).__name__, e)
        return candidates, {}, f"reranker could not load: {type(e).__name__}"
    if reranker is None:
        return candidates, {}, "no rerank model is configured (CONCORD_RERANK_KIND/MODEL)"
    window = candidates[: request.rerank.window]
    try:
        scores = rerank_within_budget(
            reranker,
            request.query,
            [rerank_passage(c.title, c.text) for c in window],
            request.rerank.budget_ms,
        )
    except RerankUnavailable as e:
        return candidates, {}, str(e)
    blend = 1.0 if request.rerank.blend is None else request.rerank.blend
    ranking = blend_scores(scores, [fused_scores[c.chunk_id] for c in window], blend)
    order = sorted(range(len(window)), key=lambda i: -ranking[i])
    info: dict[str, tuple[float, int]] = {}
    for new_rank, i in enumerate(order, start=1):
        window[i].scores["rerank"] = round(scores[i], 6)
        info[window[i].chunk_id] = (scores[i], (i + 1) - new_rank)
    return [window[i] for i in order] + candidates[len(window) :], info, None


def blend_scores(rerank: list[float], fused: list[float], blend: float) -> list[float]:
    """``blend`` x the reranker's scores + (1 - ``blend``) x the fused scores, each min-max
    normalized over the window. A reranker trained on a few hundred queries knows things the
    fused ranking does not, and the other way round: SciFact train validation, nDCG@10 of a
    20-document window: fused 0.7345, reranker alone 0.7236, blend 0.2: 0.7901."""
    if blend >= 1.0 or not rerank:
        return rerank

    def minmax(values: list[float]) -> list[float]:
        low, high = min(values), max(values)
        return [(v - low) / (high - low) if high > low else 0.0 for v in values]

    return [blend * r + (1 - blend) * f for r, f in zip(minmax(rerank), minmax(fused), strict=True)]


def _mmr(
    candidates: list[Candidate], lambda_: float, wanted: int, cap: int | None
) -> list[Candidate]:
    """Maximal marginal relevance over the candidates' own embeddings: picks until ``wanted``
    results within the per-document ``cap``, then the rest in their order. Each pick updates
    every candidate's redundancy with one matrix-vector product, so the cost is
    O(wanted x candidates x dimensions), not cubic in the candidates."""
    usable = [c for c in candidates if c.embedding is not None]
    if not usable:
        return candidates
    vectors = np.stack([np.asarray(c.embedding, dtype=np.float32) for c in usable])
    relevance = np.array(
        [c.scores.get("rerank", c.scores["dense_cosine"]) for c in usable], dtype=np.float32
    )
    # The highest similarity to any chosen candidate (0 before the first pick, as in the
    # textbook definition; negative similarities count as they are after it).
    redundancy = np.full(len(usable), -np.inf, dtype=np.float32)
    open_ = np.ones(len(usable), dtype=bool)
    per_document: dict[str, int] = {}
    chosen: list[Candidate] = []
    kept = 0
    while open_.any() and kept < wanted:
        penalty = redundancy if chosen else np.zeros_like(redundancy)
        value = np.where(open_, lambda_ * relevance - (1 - lambda_) * penalty, -np.inf)
        best = int(np.argmax(value))
        open_[best] = False
        candidate = usable[best]
        chosen.append(candidate)
        redundancy = np.maximum(redundancy, vectors @ vectors[best])
        per_document[candidate.document_id] = per_document.get(candidate.document_id, 0) + 1
        kept += cap is None or per_document[candidate.document_id] <= cap
    return chosen + [c for c, still_open in zip(usable, open_, strict=True) if still_open]


def _cap_per_document(candidates: list[Candidate], cap: int | None) -> list[Candidate]:
    return _within_cap(candidates, cap, lambda c: c.document_id)


def _within_cap(items: list[T], cap: int | None, document_of: Callable[[T], str]) -> list[T]:
    """``items`` in order, keeping at most ``cap`` per document (all of them if cap is None)."""
    if cap is None:
        return items
    seen: dict[str, int] = {}
    kept = []
    for item in items:
        document = document_of(item)
        seen[document] = seen.get(document, 0) + 1
        if seen[document] <= cap:
            kept.append(item)
    return kept


def _policy_config(
    request: SearchRequest,
    settings: Settings,
    reranked: bool,
    judged: AnswerabilityTrace | None = None,
) -> PolicyConfig:
    o = request.policy
    score_type = o.score_type or (
        "rerank" if reranked and settings.policy_score_type == "rerank" else "dense_cosine"
    )
    if score_type == "answerability":
        min_score = judged.abstain_below if judged else (o.min_score or 0.0)
    else:
        min_score = o.min_score if o.min_score is not None else settings.policy_min_score
    return PolicyConfig(
        score_type=score_type,
        min_score=min_score,
        token_budget=o.token_budget or settings.policy_token_budget,
        max_chunks_per_document=(
            o.max_chunks_per_document or settings.policy_max_chunks_per_document
        ),
        near_duplicate_threshold=(
            o.near_duplicate_threshold or settings.policy_near_duplicate_threshold
        ),
        answerability=judged,
    )


class _TokenizerCounter:
    """The policy's token counts: the embedder's tokens, as chunk sizes count them (see
    policy.TokenCounter)."""

    def __init__(self) -> None:
        self.token_offsets = get_embedder().token_offsets

    def __call__(self, text: str) -> int:
        return len(self.token_offsets(text))

    def prefix_counts(self, text: str, ends: list[int]) -> list[int]:
        # A prefix ending at a sentence end holds exactly the tokens that start before it.
        starts = [start for start, _ in self.token_offsets(text)]
        return [bisect_left(starts, end) for end in ends]


def _result(
    c: Candidate, by_arm: dict[str, dict[str, ArmHit]], fused_rank: dict[str, tuple[int, float]]
) -> SearchResult:
    return SearchResult(
        chunk_id=c.chunk_id,
        document_id=c.document_id,
        external_id=c.external_id,
        title=c.title,
        version=c.version,
        section=c.section,
        text=c.text,
        char_start=c.char_start,
        char_end=c.char_end,
        indexed_at=c.indexed_at,
        score=round(fused_rank[c.chunk_id][1], 6),
        found_by=[arm for arm in ("dense", "lexical") if c.chunk_id in by_arm.get(arm, {})],
        scores=c.scores,
    )


def _trace(
    c: Candidate,
    final_rank: int,
    by_arm: dict[str, dict[str, ArmHit]],
    fused_rank: dict[str, tuple[int, float]],
    rerank_info: dict[str, tuple[float, int]],
    policy: PolicyResult,
) -> Trace:
    def arm(name: str) -> RankScore | None:
        hit = by_arm.get(name, {}).get(c.chunk_id)
        return RankScore(rank=hit.rank, score=round(hit.score, 6)) if hit else None

    rank, score = fused_rank[c.chunk_id]
    rerank = rerank_info.get(c.chunk_id)
    return Trace(
        dense=arm("dense"),
        lexical=arm("lexical"),
        fused=RankScore(rank=rank, score=round(score, 6)),
        rerank=RerankTrace(score=round(rerank[0], 6), rank_change=rerank[1]) if rerank else None,
        final_rank=final_rank,
        policy=policy.per_result.get(c.chunk_id, "not_considered"),
    )
