"""Running a query set through Concord's real search service (over HTTP, as a user would),
configuration by configuration, plus the exact (sequential-scan) dense baseline."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np

from evaluation import repository as repo
from evaluation.metrics import order_by_score, unique
from shared.db import unit_of_work
from shared.search.retrieve import query_vector
from shared.settings import get_settings

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class EvalConfig:
    name: str
    body: dict[str, Any]  # search request fields other than the query

    @property
    def reranks(self) -> bool:
        return bool(self.body.get("rerank", {}).get("enabled"))

    @property
    def trained_reranker(self) -> str | None:
        model: str | None = self.body.get("rerank", {}).get("model")
        return model


@dataclass
class RunResult:
    rankings: dict[str, list[str]] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    stage_ms: dict[str, list[float]] = field(default_factory=dict)
    unavailable: str | None = None  # why the configuration could not run (e.g. no reranker)


def standard_configs(
    depth: int, rerank_window: int, profile: str | None = None, reranker: str | None = None
) -> list[EvalConfig]:
    """lexical, dense, hybrid RRF and hybrid convex, each without and with the rerank stage
    (the configured one; and the trained ``reranker`` when named); with a profile, the
    profile's settings the same ways.

    Every configuration asks for 100 distinct documents (one chunk per document), so that
    Recall@100 is measured on documents, the unit BEIR judges."""
    base: dict[str, Any] = {"top_k": 100, "per_document_cap": 1}
    depths = {"candidate_depth": {"dense": depth, "lexical": depth}}
    plain = {
        "lexical": {"mode": "lexical", **depths},
        "dense": {"mode": "dense", **depths},
        "hybrid_rrf": {"mode": "hybrid", "fusion": {"method": "rrf", "k": 60}, **depths},
        "hybrid_convex": {
            "mode": "hybrid",
            "fusion": {"method": "convex", "alpha": 0.5, "normalization": "minmax"},
            **depths,
        },
    }
    if profile:
        plain[f"profile:{profile}"] = {"profile": profile}
    rerank = {"rerank": {"enabled": True, "window": rerank_window, "budget_ms": 30000}}
    trained = {"rerank": {**rerank["rerank"], "model": reranker}}
    configs = []
    for name, body in plain.items():
        configs.append(EvalConfig(name, {**base, **body}))
        configs.append(EvalConfig(f"{name}+rerank", {**base, **body, **rerank}))
        if reranker:
            configs.append(EvalConfig(f"{name}+trained:{reranker}", {**base, **body, **trained}))
    return configs


class HttpPoster(Protocol):
    """What the harness needs of an HTTP client: httpx.Client, or the tests' TestClient."""

    def post(
        self, url: str, *, json: Any | None = ..., headers: Mapping[str, str] | None = ...
    ) -> httpx.Response: ...


class SearchClient:
    """POST /v1/search with one key, to the API's URL by default."""

    def __init__(self, api_key: str, http: HttpPoster | None = None) -> None:
        self.http = http or httpx.Client(base_url=get_settings().api_url(), timeout=120)
        # no-cache: every query is encoded, as the peer's are. The API's query cache would
        # otherwise serve a configuration the vectors an earlier one computed for the same
        # queries (hybrid after lexical), which flatters its latency.
        self.headers = {"Authorization": f"Bearer {api_key}", "Cache-Control": "no-cache"}

    def search(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        answer, elapsed_ms, _ = self.search_with_stages(body)
        return answer, elapsed_ms

    def search_with_stages(
        self, body: dict[str, Any]
    ) -> tuple[dict[str, Any], float, dict[str, float]]:
        """The response, its latency (ms) and its stage timings (ms, from its Server-Timing
        header: a plain request's own, with no traces asked for to get them)."""
        while True:
            started = time.perf_counter()
            response = self.http.post("/v1/search", json=body, headers=self.headers)
            elapsed_ms = (time.perf_counter() - started) * 1e3
            if response.status_code != 429:
                break
            # The key's rate limit (CONCORD_RATE_LIMIT_PER_SECOND): the eval sends one query
            # after another, faster than that once searches take under 20 ms. Wait as told
            # and send it again; only the answered request is timed.
            time.sleep(float(response.headers.get("retry-after", "1")))
        if response.status_code != 200:
            raise RuntimeError(f"search answered {response.status_code}: {response.text[:300]}")
        return (
            response.json(),
            elapsed_ms,
            parse_server_timing(response.headers.get("server-timing")),
        )


def parse_server_timing(header: str | None) -> dict[str, float]:
    """``embed;dur=4.6, dense;dur=4.5`` -> {"embed": 4.6, "dense": 4.5}."""
    stages: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if name and key == "dur":
                stages[name] = float(value)
    return stages


def run_config(
    client: SearchClient,
    config: EvalConfig,
    queries: list[tuple[str, str]],
    progress: Progress,
) -> RunResult:
    result = RunResult()
    client.search({**config.body, "query": "warm up"})
    for i, (qid, text) in enumerate(queries, start=1):
        body, elapsed_ms, stage_ms = client.search_with_stages({**config.body, "query": text})
        if config.reranks and "rerank_unavailable" in body["degraded"]:
            result.unavailable = (
                f"trained reranker {config.trained_reranker!r} did not run"
                if config.trained_reranker
                else "the API has no working reranker (CONCORD_RERANK_KIND/MODEL)"
            )
            return result
        result.rankings[qid] = unique(r["external_id"] for r in body["results"])
        result.latencies_ms.append(elapsed_ms)
        for stage, ms in stage_ms.items():
            result.stage_ms.setdefault(stage, []).append(ms)
        progress(config.name, i, len(queries))
    return result


def exact_dense(tenant_id: str, queries: list[tuple[str, str]], top_k: int = 100) -> RunResult:
    """Dense retrieval by a full scan of every chunk embedding of the tenant (no HNSW): the
    reference the approximate dense arm is held to. Same model, same query prompt."""
    settings = get_settings()
    with unit_of_work() as uow:
        rows = repo.chunk_embeddings(uow.session, tenant_id)
    doc_ids = [external_id for _, external_id, _ in rows]
    matrix = np.asarray([embedding for _, _, embedding in rows], dtype=np.float32)
    result = RunResult()
    for qid, text in queries:
        started = time.perf_counter()
        cosines = matrix @ np.asarray(query_vector(text, settings), dtype=np.float32)
        best: dict[str, float] = {}
        for doc, score in zip(doc_ids, cosines.tolist(), strict=True):
            if score > best.get(doc, -2.0):
                best[doc] = score
        result.rankings[qid] = order_by_score(best)[:top_k]
        result.latencies_ms.append((time.perf_counter() - started) * 1e3)
    return result
