"""The evaluation harness: metric code against hand-computed values (pure), then `concord eval`
and `concord tune` end to end on a tiny synthetic BEIR dataset through the real stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from evaluation.harness import EvalOptions, run_eval
from evaluation.real_docs import GAP_FIGURES
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


@pytest.mark.usefixtures("worker")
def test_eval_docs_measures_answers_decisions_and_noise_on_real_files(
    tmp_path: Path, tenant: str
) -> None:
    """`concord eval-docs` on a tiny set of files in two formats, one of them
    shipped twice under two names: the answer's chunk and file, the decision per kind of
    question, per format, and what the first results hold."""
    from services.cli.main import app

    files = tmp_path / "set" / "files"
    files.mkdir(parents=True)
    manual = (
        "# Tide tables\n\nSpring tides happen near the new and the full moon, when the sun "
        "and the moon pull along one line.\n\n## Neap tides\n\nNeap tides happen at the "
        "quarter moons, when the pulls are at right angles and the range is smallest.\n"
    )
    (files / "tides.md").write_text(manual)
    (files / "tides-copy.md").write_text(manual)  # the same page under a second name
    (files / "harbour.html").write_text(
        "<nav><a href='/'>Home</a> <a href='/a'>Charts</a> <a href='/b'>Lights</a></nav>"
        "<main><h1>Harbour lights</h1><p>A green light marks the starboard side of the "
        "channel entrance, a red light the port side.</p></main>"
    )
    questions = [
        {"id": "a1", "kind": "answerable", "question": "when do spring tides happen",
         "file": "tides.md", "evidence": "Spring tides happen near the new and the full moon"},
        {"id": "a2", "kind": "answerable", "question": "which light marks the starboard side",
         "file": "harbour.html", "evidence": "A green light marks the starboard side"},
        {"id": "n1", "kind": "near_topic", "question": "how high was the tide in 1953",
         "file": None, "evidence": None},
        {"id": "o1", "kind": "off_topic", "question": "what is the boiling point of tungsten",
         "file": None, "evidence": None},
    ]  # fmt: skip
    (tmp_path / "set" / "questions.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in questions)
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["eval-docs", str(tmp_path / "set"), "--out", str(out), "--tenant", tenant]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["questions"] == {"answerable": 2, "near_topic": 1, "off_topic": 1}
    assert summary["documents"] == {"files": 3, "failed": {}}
    assert summary["answer_chunk_at_5"] == 1.0 and summary["file_mrr_at_10"] == 1.0
    assert set(summary["per_format"]) == {"md", "html"}
    assert summary["off_topic_abstained"] == 1.0
    assert summary["repeat_share_of_top_5"] == 0.0  # the copy is shown once
    # Every question is in `tune` (no split given): the gaps are tune's figures against none.
    assert set(summary["split_gaps"]) == set(GAP_FIGURES)
    assert summary["split_gaps"]["answer_chunk_at_5"]["tune_minus_test"] == 1.0
    rows = {r["id"]: r for r in map(json.loads, (out / "questions.jsonl").read_text().splitlines())}
    assert rows["a2"]["answer_rank"] == 1 and rows["o1"]["status"] == "abstain"
    # The navigation bar is not a result.
    assert all("Charts" not in r["text"] for row in rows.values() for r in row["top"])
