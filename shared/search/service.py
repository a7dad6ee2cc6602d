"""The query path, read top to bottom: each stage takes values and returns a new one
(shared/search/values.py), in one read transaction that this service owns.

    resolve → retrieve (embed ‖ BM25, then dense) → fuse → hydrate → rerank → diversify
            → decide → respond

Every hit is hydrated from Postgres: one that Postgres does not hold at its live version is
dropped, counted, and its stale copy's purge queued once the response is made (the read path
itself writes nothing). If one store is down, the other answers and the response lists it
under ``degraded``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from sqlalchemy.exc import PendingRollbackError
from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.db import repository as db_repo
from shared.db.replica import reads_for_search
from shared.errors import StoreUnavailable
from shared.metrics import (
    DEGRADED_QUERIES,
    SEARCH_READS,
    SEARCH_SECONDS,
    SEARCH_STAGE_SECONDS,
    STALE_HITS_DROPPED,
)
from shared.relay.purges import queue_stale_copy_purges
from shared.search import cursors
from shared.search.decide import decide, judge
from shared.search.diversify import collapse_copies, crumbs_last, diversify
from shared.search.fusion import fused_ranking
from shared.search.hydrate import hydrate, hydrate_page, with_embeddings
from shared.search.rerank import rerank
from shared.search.resolve import answerability_model, resolve
from shared.search.respond import respond
from shared.search.retrieve import retrieve
from shared.search.schemas import SearchRequest, SearchResponse
from shared.search.values import Query, Ranked, RerankInfo, Retrieved
from shared.settings import Settings, get_settings
from shared.stores.compose import Stores
from shared.stores.ports import SnapshotStore, VectorSearch
from shared.timing import StageTimes

log = logging.getLogger(__name__)


def search(
    stores: Stores,
    transactions: Transactions,
    tenant_id: str,
    request: SearchRequest,
    *,
    settings: Settings | None = None,
    replica: Transactions | None = None,
    embedding_cache: bool = True,
    purge_stale: bool = True,
) -> SearchResponse:
    """One search. With ``replica``, its reads go to the replica when it has replayed
    everything committed before the search began; without ``embedding_cache``, the query is
    encoded even if the query cache holds its vector; without ``purge_stale``, the caller
    queues the purges of the stale copies it met itself (:func:`queue_purges`: the API does,
    after sending the response)."""
    query = resolve(
        transactions,
        tenant_id,
        request,
        settings=settings or get_settings(),
        embedding_cache=embedding_cache,
    )
    timings = StageTimes(scale=1e3, digits=3)  # milliseconds
    latency = SEARCH_SECONDS.labels(query.request.mode)
    with latency.time(), _reads(transactions, replica, query) as session:
        vectors = stores.vectors(session)
        arms = retrieve(query, index=stores.index, vectors=vectors, timings=timings)
        retrieved = fused_ranking(query, arms, vectors=vectors, timings=timings)
        response = page_of(query, retrieved, timings, vectors=vectors, snapshots=stores.snapshots)
    return _finish(stores, transactions, query, response, timings, purge_stale)


def search_next_page(
    stores: Stores,
    transactions: Transactions,
    tenant_id: str,
    cursor: str,
    *,
    settings: Settings | None = None,
    replica: Transactions | None = None,
    purge_stale: bool = True,
) -> SearchResponse:
    """The page after the one ``cursor`` came with: from the stored ranking, hydrated now."""
    settings = settings or get_settings()
    cursor_id, offset = cursors.decode(cursor)
    request, calibrated, retrieved = cursors.load(stores.snapshots, settings, tenant_id, cursor_id)
    judge_model = None
    if request.policy.score_type == "answerability":
        with transactions() as uow:
            judge_model = answerability_model(uow.session, tenant_id, request)
    # The first page's resolved query: its profile (in the stored request), its models, its
    # calibrated threshold; so a result is decided alike on every page.
    query = Query(tenant_id, request, settings, judge_model, calibrated_min_score=calibrated)
    timings = StageTimes(scale=1e3, digits=3)
    latency = SEARCH_SECONDS.labels(query.request.mode)
    with latency.time(), _reads(transactions, replica, query) as session:
        response = page_of(
            query,
            retrieved,
            timings,
            vectors=stores.vectors(session),
            snapshots=stores.snapshots,
            offset=offset,
            cursor_id=cursor_id,
        )
    return _finish(stores, transactions, query, response, timings, purge_stale)


def page_of(
    query: Query,
    retrieved: Retrieved,
    timings: StageTimes,
    *,
    vectors: VectorSearch,
    snapshots: SnapshotStore,
    offset: int = 0,
    cursor_id: str | None = None,
) -> SearchResponse:
    """The page of results from ``offset`` in the fused ranking (0: the first)."""
    request = query.request
    load_embeddings = functools.partial(with_embeddings, query, vectors)
    hydrate_hits = functools.partial(hydrate, query, vectors, vector=retrieved.vector)
    page = timings.timed("hydrate", lambda: hydrate_page(query, vectors, retrieved, offset=offset))
    ordered, degraded = crumbs_last(collapse_copies(page.items)), []
    rerank_info: RerankInfo = {}
    if request.rerank.enabled:
        with timings.stage("rerank"):
            ordered, rerank_info, rerank_error = rerank(query, retrieved, ordered)
        degraded = ["rerank_unavailable"] if rerank_error else []
    judged, stale = None, page.stale
    if query.answerability is not None:
        with timings.stage("answerability"):
            judged, also_stale = judge(
                query,
                retrieved,
                page,
                offset=offset,
                rerank_info=rerank_info,
                hydrate_hits=functools.partial(hydrate_hits, embeddings_for=[]),
            )
        stale = stale + also_stale
    with timings.stage("mmr") if request.mmr is not None else nullcontext():
        ordered, results = diversify(query, ordered, load_embeddings)
    ranked = Ranked(ordered, results, rerank_info, degraded)
    with timings.stage("policy"):
        policy = decide(
            query,
            results,
            dropped=page.dropped,
            judged=judged,
            reranked=bool(rerank_info),
            load_embeddings=load_embeddings,
            counts=retrieved.counts,
        )
    response = respond(
        query,
        retrieved,
        ranked,
        policy=policy,
        dropped=page.dropped,
        timings=timings,
        snapshots=snapshots,
        offset=offset,
        cursor_id=cursor_id,
    )
    response._stale = stale
    return response


@contextmanager
def _reads(
    transactions: Transactions, replica: Transactions | None, query: Query
) -> Iterator[Session]:
    """The search's one read transaction (the replica's when it is fresh enough, counted by
    where it goes), whose statements Postgres cancels after ``search_store_timeout_s``: a
    search that meets a locked or overloaded Postgres fails (503) or degrades instead of
    holding its threads and connections for as long as the store takes."""
    reads, source = reads_for_search(transactions, replica, query.settings)
    SEARCH_READS.labels(source).inc()
    try:
        with reads() as uow:
            db_repo.limit_statements(uow.session, query.settings.search_store_timeout_s)
            yield uow.session
    except PendingRollbackError as e:
        # A connection lost under a stage that degraded on it (the dense arm, in its
        # savepoint) leaves the transaction unusable: every hit is hydrated from Postgres, so
        # the search cannot go on without it; and a search with no hit to hydrate meets the
        # same at its commit (a 500 under link faults before this was caught there too).
        raise StoreUnavailable("Postgres is unavailable; retry shortly") from e


def _finish(
    stores: Stores,
    transactions: Transactions,
    query: Query,
    response: SearchResponse,
    timings: StageTimes,
    purge_stale: bool,
) -> SearchResponse:
    """The search's metrics, and (unless the caller does it later) the purges of the stale
    copies it met, on the primary, which checks them again: a copy newer than a replica
    knows is never purged."""
    response._stage_ms = timings.totals
    for stage, ms in timings.totals.items():
        SEARCH_STAGE_SECONDS.labels(stage).observe(ms / 1e3)
    for reason in response.degraded:
        DEGRADED_QUERIES.labels(reason).inc()
    STALE_HITS_DROPPED.inc(response.dropped_stale)
    if purge_stale:
        queue_purges(stores, transactions, query.settings, query.tenant_id, response)
    return response


def queue_purges(
    stores: Stores,
    transactions: Transactions,
    settings: Settings,
    tenant_id: str,
    response: SearchResponse,
) -> None:
    """Queue the purge of the stale copies ``response`` met (none: no transaction)."""
    if response._stale:
        with transactions() as uow:
            queue_stale_copy_purges(stores, uow, settings, tenant_id, response._stale)


def queue_purges_after_response(
    stores: Stores,
    transactions: Transactions,
    settings: Settings,
    tenant_id: str,
    response: SearchResponse,
) -> None:
    """:func:`queue_purges` once the response is sent, where a failure can no longer be
    answered: a store that fails then costs only the purge (logged), which the next search
    to meet the stale copy queues again (and reconciliation removes the copy anyway). An
    error let through would close the client's connection under its next request."""
    try:
        queue_purges(stores, transactions, settings, tenant_id, response)
    except Exception as e:
        log.warning("stale copies' purge not queued: %s: %s", type(e).__name__, e)
