"""The rerank stage of a search: a window reordered by the cross-encoder with a trace, the
fused order kept when it is over budget or broken."""

from __future__ import annotations

import pytest

from shared.settings import get_settings
from tests.helpers import search


def test_cross_encoder_batches_and_truncates(cross_encoder_configured):
    from shared.rerankers.scoring import get_reranker

    reranker = get_reranker(cross_encoder_configured)
    assert reranker is not None
    passages = [f"passage number {i} about topic {i % 3}" for i in range(11)]
    batched = reranker.score("topic", passages)  # 3 batches of 4
    single = [reranker.score("topic", [p])[0] for p in passages]
    assert batched == pytest.approx(single, abs=1e-5)
    long = "word " * 5000
    assert reranker.score("q", [long]) == pytest.approx(
        reranker.score("q", ["word " * 40]), abs=1e-5
    )


def test_rerank_reorders_the_window_by_score_with_a_trace(
    client, auth, corpus, cross_encoder_configured
):
    body = search(
        client,
        auth,
        "animals and machines",
        rerank={"enabled": True, "window": 3},
        explain=True,
        policy={"score_type": "rerank", "min_score": -100},
    )
    assert body["degraded"] == []
    window = body["results"][:3]
    scores = [r["trace"]["rerank"]["score"] for r in window]
    assert scores == sorted(scores, reverse=True)
    assert all(r["trace"]["rerank"] is None for r in body["results"][3:])
    changes = [r["trace"]["rerank"]["rank_change"] for r in window]
    assert sum(changes) == 0
    assert body["decision"]["score_type"] == "rerank"


def test_rerank_over_budget_or_broken_keeps_the_fused_order(
    client, auth, corpus, monkeypatch, cross_encoder_configured
):
    import time

    from shared.rerankers.scoring import get_reranker

    # The test's tiny cross-encoder can score four short passages within 1 ms: slowed here,
    # so that the budget is what runs out, every time.
    reranker = get_reranker(cross_encoder_configured)
    assert reranker is not None
    score = reranker.score

    def slow_score(query: str, passages: list[str]) -> list[float]:
        time.sleep(0.2)
        return score(query, passages)

    monkeypatch.setattr(reranker, "score", slow_score)
    plain = search(client, auth, "animals and machines")
    slow = search(
        client, auth, "animals and machines", rerank={"enabled": True, "budget_ms": 1, "window": 4}
    )
    assert slow["degraded"] == ["rerank_unavailable"]
    assert [r["chunk_id"] for r in slow["results"]] == [r["chunk_id"] for r in plain["results"]]

    monkeypatch.setattr(get_settings(), "rerank_model", "/nonexistent/model")
    broken = search(client, auth, "animals and machines", rerank={"enabled": True})
    assert broken["degraded"] == ["rerank_unavailable"]
    assert [r["chunk_id"] for r in broken["results"]] == [r["chunk_id"] for r in plain["results"]]
