"""Abstain accuracy: does the evidence policy say "I don't know" when the index cannot answer?

The unanswerable variant withholds from the index every relevant document of a random half of
the queries. A query is *unanswerable* when none of its relevant documents is left in the index,
*answerable* otherwise. For each query the policy's decision and the top score it judged
(``decision.top_score``) are recorded, so a threshold sweep needs no second pass: the policy
abstains (``below_threshold``) exactly when every result's score is below the threshold."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from evaluation.beir import Qrels
from evaluation.runner import Progress, SearchClient


@dataclass(frozen=True)
class Withholding:
    withheld_docs: frozenset[str]
    unanswerable: frozenset[str]  # query ids with no relevant document left
    answerable: frozenset[str]


def withhold_half(queries: list[tuple[str, str]], qrels: Qrels, seed: int) -> Withholding:
    ids = sorted(qid for qid, _ in queries)
    chosen = random.Random(seed).sample(ids, len(ids) // 2)
    withheld = frozenset(d for qid in chosen for d, r in qrels[qid].items() if r > 0)
    unanswerable = frozenset(
        qid for qid in ids if not any(r > 0 and d not in withheld for d, r in qrels[qid].items())
    )
    return Withholding(withheld, unanswerable, frozenset(ids) - unanswerable)


@dataclass
class AbstainRun:
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # qid -> decision

    def rates(self, w: Withholding, threshold: float | None = None) -> dict[str, float]:
        """Abstain recall on unanswerable queries and false-abstain rate on answerable ones,
        as served (``threshold`` None) or as they would be at another threshold."""

        def abstains(qid: str) -> bool:
            decision = self.decisions[qid]
            if threshold is None:
                return bool(decision["status"] == "abstain")
            top = decision["top_score"]
            return top is None or top < threshold

        unanswerable = [q for q in w.unanswerable if q in self.decisions]
        answerable = [q for q in w.answerable if q in self.decisions]
        return {
            "abstain_recall": _share(unanswerable, abstains),
            "false_abstain": _share(answerable, abstains),
        }

    def sweep(self, w: Withholding, steps: int = 101) -> list[dict[str, float]]:
        return [
            {"threshold": round(t, 4), **self.rates(w, t)}
            for t in (i / (steps - 1) for i in range(steps))
        ]


def _share(ids: list[str], predicate: Any) -> float:
    return round(sum(1 for q in ids if predicate(q)) / len(ids), 4) if ids else 0.0


def run_abstain(
    client: SearchClient,
    queries: list[tuple[str, str]],
    progress: Progress,
    label: str,
    body: dict[str, Any] | None = None,
) -> AbstainRun:
    """Each query with the policy's defaults (or ``body``, e.g. a profile), as a caller sends it."""
    run = AbstainRun()
    for i, (qid, text) in enumerate(queries, start=1):
        response, _ = client.search({**(body or {}), "query": text})
        run.decisions[qid] = response["decision"]
        progress(label, i, len(queries))
    return run


def best_threshold(
    sweep: list[dict[str, float]], max_false_abstain: float = 0.05
) -> dict[str, float]:
    """The threshold with the highest abstain recall whose false-abstain rate stays within the
    limit (ties: the lower threshold)."""
    allowed = [row for row in sweep if row["false_abstain"] <= max_false_abstain]
    return max(allowed, key=lambda row: (row["abstain_recall"], -row["threshold"]))


def roc(run: AbstainRun, w: Withholding, max_false_abstain: float = 0.05) -> dict[str, Any]:
    """The policy's score as an abstain classifier on the variant: the full curve (abstain
    recall against false abstains, one point per distinct score), its area (the probability
    that an answerable query scores above an unanswerable one, ties half), the best point
    within ``max_false_abstain``, and the share of ``verify`` decisions as served."""

    def score(qid: str) -> float:
        top = run.decisions[qid]["top_score"]
        return float("-inf") if top is None else float(top)

    answerable = [score(q) for q in w.answerable if q in run.decisions]
    unanswerable = [score(q) for q in w.unanswerable if q in run.decisions]
    curve: list[dict[str, Any]] = []
    for t in sorted({*answerable, *unanswerable, float("inf")}):
        curve.append(
            {
                "threshold": t if t not in (float("inf"), float("-inf")) else None,
                "abstain_recall": round(sum(s < t for s in unanswerable) / len(unanswerable), 4),
                "false_abstain": round(sum(s < t for s in answerable) / len(answerable), 4),
            }
        )
    wins = sum(1.0 if a > u else 0.5 if a == u else 0.0 for a in answerable for u in unanswerable)
    within = [p for p in curve if p["false_abstain"] <= max_false_abstain]
    best = max(within, key=lambda p: p["abstain_recall"])
    statuses = [d["status"] for d in run.decisions.values()]
    return {
        "auc": round(wins / (len(answerable) * len(unanswerable)), 4),
        "best_within_5pct_false_abstain": best,
        "verify_share": round(statuses.count("verify") / len(statuses), 4),
        "curve": curve,
    }
