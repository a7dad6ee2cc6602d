"""The evaluation harness: metric code against hand-computed values (pure), then `concord eval`
and `concord tune` end to end on a tiny synthetic BEIR dataset through the real stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from evaluation.harness import EvalOptions, run_eval
from tests.helpers import TINY, poster, progress_log


@pytest.mark.usefixtures("worker")
def test_eval_end_to_end_on_a_tiny_dataset(client: TestClient, tmp_path: Path) -> None:
    log, progress = progress_log()
    options = EvalOptions(peer=False, rerank_window=5, depth=30)
    paths = run_eval(TINY, tmp_path / "first", options, progress, http=poster(client))

    report = json.loads(paths["json"].read_text())
    rows = {c["name"]: c for c in report["configs"]}
    for name in ("lexical", "dense", "hybrid_rrf", "hybrid_convex"):
        assert rows[name]["metrics"]["queries"] == 8, name
        assert rows[name]["latency_ms"]["p50"] > 0
        # The queries were written to be answerable; a broken path scores near zero.
        assert rows[name]["metrics"]["ndcg@10"] > 0.5, (name, rows[name]["metrics"])
        if name != "lexical":  # BM25 cannot find a document that shares no term with the query
            assert rows[name]["metrics"]["recall@100"] == 1.0, name
        # Stage timings come from each plain request's Server-Timing header.
        assert {"hydrate", "policy"} <= set(rows[name]["stage_ms_mean"]), name
    # No reranker is configured in the test settings: those rows say so instead of faking it.
    assert "reranker" in rows["hybrid_rrf+rerank"]["unavailable"]
    exact = rows["exact_dense (sequential scan)"]["metrics"]["ndcg@10"]
    assert abs(rows["dense"]["metrics"]["ndcg@10"] - exact) <= 0.005
    # Every document is sent, or was already there (another test may have synced the corpus).
    ingest = report["ingest"]
    assert ingest["published"] + ingest["unchanged"] == 24
    assert ingest["indexed"] == 24

    a = report["abstain"]
    assert a["unanswerable"] + a["answerable"] == 8 and a["unanswerable"] >= 4
    assert len(a["sweep"]) == 101
    assert a["served"][0]["policy"] == "defaults"

    for kind in ("quality_png", "latency_png", "abstain_png"):
        assert paths[kind].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", kind
    markdown = paths["markdown"].read_text()
    assert "| hybrid_rrf |" in markdown and "Abstain accuracy" in markdown
    stages = {stage for stage, _, _ in log}
    assert {"publish", "index", "hybrid_rrf"} <= stages

    # A re-run publishes nothing: every document is unchanged.
    quick = EvalOptions(peer=False, rerank=False, abstain=False)
    again = run_eval(TINY, tmp_path / "second", quick, progress, http=poster(client))
    second = json.loads(again["json"].read_text())
    assert second["ingest"]["published"] == 0 and second["ingest"]["unchanged"] == 24


def test_eval_command_reports_a_bad_dataset_clearly(tmp_path: Path) -> None:
    from services.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--dataset", str(tmp_path / "absent")])
    assert result.exit_code == 2
    assert "is not a directory" in " ".join(result.output.split())
