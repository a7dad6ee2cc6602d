"""Fusion (shared/search/fusion.py) and the metadata boost (boost.py)."""

from __future__ import annotations

import pytest

from shared.search.fusion import rrf
from shared.stores.schemas import ArmHit


def test_rrf_rewards_agreement_and_respects_weights():
    dense = [ArmHit("a", 1, 0.9), ArmHit("b", 2, 0.8)]
    lexical = [ArmHit("b", 1, 12.0), ArmHit("c", 2, 9.0)]
    fused = rrf({"dense": dense, "lexical": lexical}, k=60)
    assert fused[0][0] == "b"
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    weighted = rrf(
        {"dense": dense, "lexical": lexical}, k=60, weights={"dense": 0.0, "lexical": 1.0}
    )
    assert [cid for cid, _ in weighted][:2] == ["b", "c"]


def test_the_metadata_boost_lifts_recent_or_large_values_and_leaves_the_rest() -> None:
    from datetime import UTC, datetime

    from shared.search.boost import boosted
    from shared.search.schemas import Boost

    now = datetime(2026, 12, 1, tzinfo=UTC)
    fused = [("old", 1.0), ("new", 0.9), ("none", 0.8), ("odd", 0.7)]  # spread 0.3
    values = {"old": "2016-12-01", "new": "2026-11-30T00:00:00Z", "odd": 17}
    recency = Boost(field="published", weight=1.0, half_life_days=365)
    ranked = boosted(fused, values, recency, now)
    assert [cid for cid, _ in ranked] == ["new", "old", "none", "odd"]
    scores = dict(ranked)
    assert scores["new"] == pytest.approx(0.9 + 0.3 * 0.5 ** (1 / 365))
    assert scores["old"] == pytest.approx(1.0 + 0.3 * 0.5**10, rel=1e-3)  # ten half-lives
    assert scores["none"] == 0.8 and scores["odd"] == 0.7  # no date: no lift
    numeric = Boost(field="year", kind="numeric", weight=1.0)
    years = {"old": 2016, "new": 2026, "odd": "n/a"}
    assert dict(boosted(fused, years, numeric, now)) == {
        "new": pytest.approx(1.2),
        "old": 1.0,
        "none": 0.8,
        "odd": 0.7,
    }
    # Negative scores (a z-scored convex fusion) are lifted too, never pushed down.
    negative = [("a", 0.5), ("b", -0.2), ("c", -1.0)]
    lifted = dict(boosted(negative, {"b": 2026, "c": 2016}, numeric, now))
    assert lifted["b"] == pytest.approx(-0.2 + 1.5) and lifted["c"] == -1.0 and lifted["a"] == 0.5


def test_each_arms_first_hits_join_the_passages_window_wherever_fusion_put_them() -> None:
    """A chunk BM25 ranks first that the encoder does not find at all (an exact name, "SM3",
    in a changelog whose every chunk both arms return) is fused 26th, behind every chunk
    both arms rank moderately: out of the first 20 that the passages stage reorders."""
    from shared.search.fusion import ARM_LEADERS, passage_window
    from shared.search.values import Arms

    fused = [(f"news:{i}", 1.0 - i / 100) for i in range(30)]
    lexical = [ArmHit("news:25", 1, 9.0), ArmHit("news:2", 2, 8.0), ArmHit("news:28", 3, 7.5)]
    dense = [ArmHit(f"news:{i}", rank, 0.9 - rank / 10) for rank, i in enumerate((0, 1, 3, 27), 1)]
    arms = Arms({"lexical": lexical, "dense": dense}, [], [])
    window = passage_window(fused, arms, 5)
    assert ARM_LEADERS == 3
    # the first five, then the leaders beyond them in fused order; the dense arm's fourth not
    assert [cid for cid, _ in window] == [f"news:{i}" for i in range(5)] + ["news:25", "news:28"]
    assert passage_window(fused, arms, 30) == fused  # each once
