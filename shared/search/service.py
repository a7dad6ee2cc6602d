"""Hybrid search: pgvector (dense) and Elasticsearch BM25 (lexical) run concurrently, are fused
by weighted reciprocal rank fusion, and every hit is hydrated from Postgres.

A hit Postgres does not hold at its live version is dropped, counted and queued for repair, so
the read path never serves stale or deleted text. If one store is down, the other answers and
the response says ``degraded``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from elasticsearch import ApiError, TransportError
from sqlalchemy.exc import SQLAlchemyError

from shared.db import unit_of_work
from shared.ingest.embedding import get_embedder
from shared.search import repository as search_repo
from shared.settings import Settings, get_settings
from shared.stores.elastic import get_es

log = logging.getLogger(__name__)

Mode = Literal["dense", "lexical", "hybrid"]
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="search-arm")


@dataclass(frozen=True)
class ArmHit:
    chunk_id: str
    rank: int
    score: float
    version: int | None = None


@dataclass
class SearchHit:
    chunk_id: str
    document_id: str
    external_id: str
    title: str
    section: str
    text: str
    version: int
    score: float
    found_by: list[str]
    ranks: dict[str, int] = field(default_factory=dict)
    arm_scores: dict[str, float] = field(default_factory=dict)


@dataclass
class SearchResponse:
    query: str
    mode: Mode
    hits: list[SearchHit]
    degraded: list[str]
    dropped_stale: int


def dense_arm(
    tenant_id: str, query_vector: list[float], depth: int, settings: Settings
) -> list[ArmHit]:
    with unit_of_work() as uow:
        rows = search_repo.nearest_chunks(
            uow.session, tenant_id, query_vector, depth, settings.hnsw_ef_search
        )
    return [
        ArmHit(cid, rank, 1.0 - float(distance))
        for rank, (cid, distance) in enumerate(rows, start=1)
    ]


def lexical_arm(tenant_id: str, query: str, depth: int, settings: Settings) -> list[ArmHit]:
    response = get_es().search(
        index=settings.es_chunks_alias(),
        size=depth,
        query={
            "bool": {
                # User text only ever reaches a match query, never query_string.
                "must": [
                    {"multi_match": {"query": query, "fields": ["title^2", "section", "text"]}}
                ],
                "filter": [{"term": {"tenant_id": tenant_id}}],
            }
        },
        source_includes=["version"],
        version=True,
    )
    return [
        ArmHit(hit["_id"], rank, float(hit["_score"]), hit.get("_version"))
        for rank, hit in enumerate(response["hits"]["hits"], start=1)
    ]


def rrf_fuse(
    arms: dict[str, list[ArmHit]], k: int, weights: dict[str, float] | None = None
) -> list[tuple[str, float]]:
    scores: dict[str, float] = {}
    for arm, hits in arms.items():
        weight = (weights or {}).get(arm, 1.0)
        for hit in hits:
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + weight / (k + hit.rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def search(
    tenant_id: str,
    query: str,
    top_k: int = 10,
    mode: Mode = "hybrid",
    settings: Settings | None = None,
) -> SearchResponse:
    settings = settings or get_settings()
    depth = max(settings.candidate_depth, top_k)
    futures = {}
    if mode in ("dense", "hybrid"):
        vector = get_embedder().embed_query(query).tolist()
        futures["dense"] = _pool.submit(dense_arm, tenant_id, vector, depth, settings)
    if mode in ("lexical", "hybrid"):
        futures["lexical"] = _pool.submit(lexical_arm, tenant_id, query, depth, settings)

    arms: dict[str, list[ArmHit]] = {}
    degraded: list[str] = []
    for arm, future in futures.items():
        try:
            arms[arm] = future.result()
        except (ApiError, TransportError, SQLAlchemyError) as e:
            log.warning("%s arm unavailable: %s: %s", arm, type(e).__name__, e)
            degraded.append(f"{arm}_unavailable")
    if not arms:
        return SearchResponse(query, mode, [], degraded, 0)

    fused = rrf_fuse(arms, settings.rrf_k)
    hits, dropped = _hydrate(tenant_id, fused, arms, top_k)
    return SearchResponse(query, mode, hits, degraded, dropped)


def _hydrate(
    tenant_id: str, fused: list[tuple[str, float]], arms: dict[str, list[ArmHit]], top_k: int
) -> tuple[list[SearchHit], int]:
    by_arm = {arm: {h.chunk_id: h for h in hits} for arm, hits in arms.items()}
    window = [cid for cid, _ in fused[: top_k * 3]]
    with unit_of_work() as uow:
        live = search_repo.live_chunks(uow.session, tenant_id, window)
        stale = [cid for cid in window if cid not in live]
        if stale:
            search_repo.queue_repair(uow.session, tenant_id, stale)
    hits: list[SearchHit] = []
    for cid, score in fused:
        row = live.get(cid)
        if row is None:
            continue
        found = [arm for arm in ("dense", "lexical") if cid in by_arm.get(arm, {})]
        hits.append(
            SearchHit(
                chunk_id=cid,
                document_id=str(row.document_id),
                external_id=row.external_id,
                title=row.title,
                section=row.section,
                text=row.text,
                version=row.version,
                score=round(score, 6),
                found_by=found,
                ranks={arm: by_arm[arm][cid].rank for arm in found},
                arm_scores={arm: round(by_arm[arm][cid].score, 6) for arm in found},
            )
        )
        if len(hits) == top_k:
            break
    return hits, len(stale)


def as_dict(response: SearchResponse) -> dict[str, Any]:
    return {
        "query": response.query,
        "mode": response.mode,
        "degraded": response.degraded,
        "dropped_stale": response.dropped_stale,
        "results": [vars(h) for h in response.hits],
    }
