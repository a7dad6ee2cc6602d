"""Fusion of the dense and lexical candidate lists.

* Weighted reciprocal rank fusion: ``sum(w_arm / (k + rank_arm))``; uses ranks only.
* Convex combination: each arm's scores normalized (min-max or z-score) and combined as
  ``alpha * dense + (1 - alpha) * lexical``; a candidate an arm did not return gets that arm's
  lowest normalized score.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from shared.search.schemas import Fusion


@dataclass(frozen=True)
class ArmHit:
    chunk_id: str
    rank: int
    score: float


def rrf(
    arms: dict[str, list[ArmHit]], k: int, weights: dict[str, float] | None = None
) -> list[tuple[str, float]]:
    scores: dict[str, float] = {}
    for arm, hits in arms.items():
        weight = (weights or {}).get(arm, 1.0)
        for hit in hits:
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + weight / (k + hit.rank)
    return _ordered(scores)


def normalize(scores: list[float], method: str) -> list[float]:
    if not scores:
        return []
    if method == "zscore":
        mean = statistics.fmean(scores)
        spread = statistics.pstdev(scores)
        return [(s - mean) / spread if spread else 0.0 for s in scores]
    low, high = min(scores), max(scores)
    return [(s - low) / (high - low) if high > low else 1.0 for s in scores]


def convex(arms: dict[str, list[ArmHit]], alpha: float, method: str) -> list[tuple[str, float]]:
    normalized: dict[str, dict[str, float]] = {}
    for arm, hits in arms.items():
        values = normalize([h.score for h in hits], method)
        normalized[arm] = {h.chunk_id: v for h, v in zip(hits, values, strict=True)}
    floor = {arm: min(values.values(), default=0.0) for arm, values in normalized.items()}
    weight = {"dense": alpha, "lexical": 1.0 - alpha}
    candidates = {cid for values in normalized.values() for cid in values}
    scores = {
        cid: sum(weight[arm] * normalized[arm].get(cid, floor[arm]) for arm in normalized)
        for cid in candidates
    }
    return _ordered(scores)


def fuse(arms: dict[str, list[ArmHit]], options: Fusion) -> list[tuple[str, float]]:
    if options.method == "convex":
        return convex(arms, options.alpha, options.normalization)
    return rrf(arms, options.k, {str(arm): w for arm, w in options.weights.items()})


def _ordered(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
