"""The evaluation harness: metric code against hand-computed values (pure), then `concord eval`
and `concord tune` end to end on a tiny synthetic BEIR dataset through the real stack."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from evaluation import abstain, beir, metrics


def log2(x: float) -> float:
    return math.log2(x)


# --- metrics (pure) -----------------------------------------------------------------------


def test_ndcg_with_graded_relevance_matches_hand_computation() -> None:
    judgements = {"a": 2, "b": 1, "c": 0}
    # Ranked: x (0), a (2), b (1): DCG = 2/log2(3) + 1/log2(4); ideal: 2/log2(2) + 1/log2(3)
    expected = (2 / log2(3) + 1 / log2(4)) / (2 / log2(2) + 1 / log2(3))
    assert metrics.ndcg_at_k(["x", "a", "b"], judgements, 10) == pytest.approx(expected)
    assert metrics.ndcg_at_k(["a", "b"], judgements, 10) == pytest.approx(1.0)
    # Cut at k=1: only x counts -> 0
    assert metrics.ndcg_at_k(["x", "a", "b"], judgements, 1) == 0.0


def test_recall_mrr_and_failure_rate() -> None:
    judgements = {"a": 1, "b": 1, "c": 1, "d": 0}
    ranking = ["d", "z", "a", "b"]
    assert metrics.recall_at_k(ranking, judgements, 10) == pytest.approx(2 / 3)
    assert metrics.recall_at_k(ranking, judgements, 3) == pytest.approx(1 / 3)
    assert metrics.mrr_at_k(ranking, judgements, 10) == pytest.approx(1 / 3)
    assert metrics.mrr_at_k(ranking, judgements, 2) == 0.0
    row = metrics.per_query(ranking, judgements)
    assert row["failure@20"] == pytest.approx(1 - 2 / 3)


def test_duplicates_count_once_at_their_first_position() -> None:
    judgements = {"a": 1, "b": 1}
    assert metrics.recall_at_k(["a", "a", "b"], judgements, 2) == 1.0
    assert metrics.ndcg_at_k(["a", "a", "b"], judgements, 10) == pytest.approx(1.0)


def test_ties_are_ordered_by_document_id_descending() -> None:
    scores = {"d1": 0.5, "d3": 0.9, "d2": 0.5, "d0": 0.5}
    assert metrics.order_by_score(scores) == ["d3", "d2", "d1", "d0"]
    judgements = {"d0": 1}
    # d0 loses every tie, so it is ranked 4th, not 2nd
    assert metrics.mrr_at_k(metrics.order_by_score(scores), judgements, 10) == pytest.approx(1 / 4)


def test_queries_without_judgements_are_left_out_and_counted() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}  # q2 has no relevant document
    rankings = {"q1": ["a"], "q2": ["b"], "q3": ["c"]}
    result = metrics.evaluate(rankings, qrels)
    assert result["queries"] == 1
    assert result["unjudged"] == 2
    assert result["ndcg@10"] == 1.0
    # A judged query without a ranking scores zero instead of vanishing from the average.
    assert metrics.evaluate({}, {"q1": {"a": 1}})["ndcg@10"] == 0.0


def test_percentiles_use_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert metrics.percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "mean": 50.5}
    assert metrics.percentiles([])["p95"] == 0.0


def test_latency_targets_compare_every_mode_with_the_peer() -> None:
    from evaluation.harness import targets

    def row(name: str, p50: float, p95: float) -> dict[str, Any]:
        return {"name": name, "metrics": {"ndcg@10": 0.7}, "latency_ms": {"p50": p50, "p95": p95}}

    configs = [row("dense", 15.0, 22.0), row("haystack:dense", 17.0, 21.0)]
    configs += [row("hybrid_rrf", 20.0, 30.0), row("haystack:hybrid_rrf", 70.0, 120.0)]
    checks = {t["target"]: t["met"] for t in targets({"configs": configs, "anchors": []})}
    assert checks["dense p50 ≤ Haystack dense p50"] is True
    assert checks["dense p95 ≤ Haystack dense p95"] is False
    assert checks["hybrid_rrf p95 ≤ Haystack hybrid_rrf p95"] is True
    assert not any(target.startswith("lexical") for target in checks)  # no lexical rows ran


def test_withholding_makes_exactly_the_chosen_half_unanswerable() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"a": 1, "c": 1}, "q4": {"d": 1}}
    queries = [(q, q) for q in qrels]
    w = abstain.withhold_half(queries, qrels, seed=1)
    assert len(w.unanswerable | w.answerable) == 4
    for qid in w.unanswerable:
        assert all(d in w.withheld_docs for d in qrels[qid])
    for qid in w.answerable:
        assert any(d not in w.withheld_docs for d in qrels[qid])


def test_threshold_sweep_and_choice() -> None:
    w = abstain.Withholding(frozenset(), frozenset({"u1", "u2"}), frozenset({"a1", "a2"}))
    run = abstain.AbstainRun(
        {
            "u1": {"status": "answerable", "top_score": 0.30},
            "u2": {"status": "abstain", "top_score": 0.10},
            "a1": {"status": "answerable", "top_score": 0.60},
            "a2": {"status": "answerable", "top_score": 0.50},
        }
    )
    assert run.rates(w) == {"abstain_recall": 0.5, "false_abstain": 0.0}
    assert run.rates(w, 0.4) == {"abstain_recall": 1.0, "false_abstain": 0.0}
    assert run.rates(w, 0.55) == {"abstain_recall": 1.0, "false_abstain": 0.5}
    best = abstain.best_threshold(run.sweep(w))
    assert best["abstain_recall"] == 1.0 and best["false_abstain"] == 0.0
    assert 0.30 < best["threshold"] <= 0.50


def test_dataset_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(beir.DatasetError, match=r"corpus\.jsonl is missing"):
        beir.load(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\nnot json\n')
    with pytest.raises(beir.DatasetError, match=r"corpus.jsonl:2: not JSON"):
        beir.load(tmp_path)


# --- end to end through the real stack --------------------------------------------------


def test_threshold_simulation_keeps_documents_in_rank_order() -> None:
    from evaluation.tune import first_chunk_per_document

    ranking = ["c1", "c2", "c3", "c4"]
    doc_of = {"c1": "d1", "c2": "d2", "c3": "d1", "c4": "d3"}
    first = first_chunk_per_document(ranking, doc_of)
    assert list(first.items()) == [("d1", "c1"), ("d2", "c2"), ("d3", "c4")]


def test_eval_docs_tells_noise_from_short_answers() -> None:
    from evaluation.real_docs import holds_evidence, is_noise

    assert is_noise("Next: Closure API, Previous: Types, Up: Using libffi", "")
    assert is_noise("Closure Example", "Using libffi > Closure Example")  # its heading alone
    assert is_noise("Home » Docs » Path\nSkip to content", "")
    assert is_noise("¶ …", "Intro")
    assert not is_noise("| `--json` | false | Boolean |", "Flags > | Flag | Default | Type |")
    assert not is_noise("List all staged package versions", "npm stage list")
    assert holds_evidence("Spring tides  happen near the ﬁrst moon .", "spring tides happen near")
    # a span quoted from a Markdown file, in the same page's HTML text, and the reverse
    html = "Provides the platform-specific path delimiter:\n\n; for Windows\n\n: for POSIX"
    quote = "Provides the platform-specific path delimiter: * `;` for Windows * `:` for POSIX"
    assert holds_evidence(html, quote)
    assert holds_evidence("always returns `path` without *any* change", "returns path without any")
    assert not holds_evidence(html, "path delimiter: , for Windows")


def _devset_row(
    number: int, split: str, kind: str, answer_rank: int | None, status: str
) -> dict[str, Any]:
    found = answer_rank is not None
    return {
        "id": f"{split}-{kind}-{number}", "split": split, "kind": kind, "style": "formal",
        "format": "txt", "status": status,
        "answer_rank": answer_rank, "file_rank": answer_rank, "file_hit": found,
        "answer_packed": found, "results": 5, "noise": 0, "stubs": 0, "crumbs": 0, "repeats": 0,
    }  # fmt: skip


def test_eval_docs_gives_each_split_gap_with_its_bootstrap_interval() -> None:
    from evaluation.real_docs import split_gaps

    # Each half: 60 answerable questions on 20 files, 40 near-topic questions (of no file).
    def half(split: str, first: int, caught: int) -> list[dict[str, Any]]:
        answerable = [
            _devset_row(i, split, "answerable", 1 if i < first else 7, "answerable")
            | {"file": f"{split}-{i % 20}.txt"}
            for i in range(60)
        ]
        near = [
            _devset_row(i, split, "near_topic", None, "verify" if i < caught else "answerable")
            for i in range(40)
        ]
        return answerable + near

    # Answer chunk first 30 of 60 in both halves; near-topic caught 36 of 40 against 8 of 40.
    gaps = split_gaps(half("tune", 30, 36) + half("test", 30, 8), resamples=300)
    same, apart = gaps["answer_chunk_at_1"], gaps["near_topic_caught"]
    assert same["tune_minus_test"] == 0.0
    low, high = same["interval_95"]
    assert low < 0 < high  # equal halves: sampling alone spreads the difference both ways
    assert apart["tune_minus_test"] == pytest.approx(0.9 - 0.2)
    low, high = apart["interval_95"]
    assert 0.4 < low <= 0.7 <= high < 0.9  # a difference no resampling closes
