"""Retrieval metrics over document rankings, as BEIR computes them with pytrec_eval.

* nDCG@k with graded relevance as the gain (``rel / log2(rank + 1)``), ideal from the judgements.
* Recall@k: the share of relevant documents (relevance > 0) in the first k.
* MRR@k: the reciprocal rank of the first relevant document in the first k (0 if none).
* Failure rate: ``1 - Recall@20``.
Queries without any relevant judgement are left out of the averages (and counted); a document
ranked twice counts once, at its first position. Scores that tie are ordered by document id,
descending, as trec_eval does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

from evaluation.beir import Qrels

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10", "failure@20")


def order_by_score(scores: Mapping[str, float]) -> list[str]:
    by_id_desc = sorted(scores, reverse=True)
    return sorted(by_id_desc, key=lambda doc: -scores[doc])  # stable: ties keep id descending


def unique(ranking: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ranking))  # first occurrence wins, order kept


def ndcg_at_k(ranking: list[str], judgements: Mapping[str, int], k: int) -> float:
    dcg = sum(
        judgements.get(doc, 0) / math.log2(i + 2)
        for i, doc in enumerate(unique(ranking)[:k])
        if judgements.get(doc, 0) > 0
    )
    ideal = sorted((r for r in judgements.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at_k(ranking: list[str], judgements: Mapping[str, int], k: int) -> float:
    relevant = {doc for doc, r in judgements.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant & set(unique(ranking)[:k])) / len(relevant)


def mrr_at_k(ranking: list[str], judgements: Mapping[str, int], k: int) -> float:
    for i, doc in enumerate(unique(ranking)[:k], start=1):
        if judgements.get(doc, 0) > 0:
            return 1.0 / i
    return 0.0


def per_query(ranking: list[str], judgements: Mapping[str, int]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg_at_k(ranking, judgements, 10),
        "recall@10": recall_at_k(ranking, judgements, 10),
        "recall@100": recall_at_k(ranking, judgements, 100),
        "mrr@10": mrr_at_k(ranking, judgements, 10),
        "failure@20": 1.0 - recall_at_k(ranking, judgements, 20),
    }


def evaluate(rankings: Mapping[str, list[str]], qrels: Qrels) -> dict[str, float]:
    """Mean of each metric over the judged queries; a judged query without a ranking scores 0.
    ``queries`` is how many were averaged, ``unjudged`` how many rankings had no judgement."""
    judged = [qid for qid, j in qrels.items() if any(r > 0 for r in j.values())]
    rows = [per_query(rankings.get(qid, []), qrels[qid]) for qid in judged]
    means = {m: round(statistics.fmean(r[m] for r in rows), 4) if rows else 0.0 for m in METRICS}
    return {
        **means,
        "queries": len(rows),
        "unjudged": sum(1 for qid in rankings if qid not in set(judged)),
    }


def nearest_rank(ordered: list[float], p: float) -> float:
    """The ``p``-th percentile of the sorted, non-empty ``ordered`` by the nearest-rank
    method (no interpolation between samples)."""
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def percentiles(latencies_ms: list[float]) -> dict[str, float]:
    """p50/p95/p99 by the nearest-rank method (no interpolation between samples)."""
    if not latencies_ms:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}
    ordered = sorted(latencies_ms)
    return {
        "p50": round(nearest_rank(ordered, 50), 1),
        "p95": round(nearest_rank(ordered, 95), 1),
        "p99": round(nearest_rank(ordered, 99), 1),
        "mean": round(statistics.fmean(ordered), 1),
    }
