"""The rerank stage (shared/search/rerank.py): blending, and its budget."""

from __future__ import annotations

import pytest


def test_blend_scores_mix_min_max_normalized_rerank_and_fused_scores() -> None:
    from shared.search.rerank import blend_scores

    rerank, fused = [3.0, 1.0, 2.0], [0.1, 0.3, 0.2]
    assert blend_scores(rerank, fused, 1.0) == rerank  # the reranker alone, raw
    assert blend_scores(rerank, fused, 0.0) == pytest.approx([0.0, 1.0, 0.5])
    assert blend_scores(rerank, fused, 0.25) == pytest.approx([0.25, 0.75, 0.5])
    assert blend_scores([], [], 0.3) == []


def test_rerank_work_whose_budget_ran_out_is_not_left_queued() -> None:
    """Wide windows with tiny budgets, many times over: each request gives up at once, and
    its model work, still waiting for the one rerank thread, is cancelled rather than queued,
    so the next search's rerank (any tenant's) waits for at most the one call running."""
    import threading

    from shared.rerankers.scoring import RerankUnavailable, rerank_within_budget

    release = threading.Event()
    calls: list[int] = []

    class Slow:
        name = "slow"

        def score(self, query: str, passages: list[str]) -> list[float]:
            calls.append(len(passages))
            release.wait(5)
            return [0.0] * len(passages)

    class Fast:
        name = "fast"

        def score(self, query: str, passages: list[str]) -> list[float]:
            return [1.0] * len(passages)

    for _ in range(10):
        with pytest.raises(RerankUnavailable):
            rerank_within_budget(Slow(), "q", ["p"] * 200, budget_ms=20)
    release.set()  # the one call that started finishes
    assert rerank_within_budget(Fast(), "q", ["a", "b"], budget_ms=2000) == [1.0, 1.0]
    assert calls == [200]  # the other nine never ran
