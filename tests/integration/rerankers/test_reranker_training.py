"""`concord reranker train` end to end on the tiny synthetic BEIR dataset, through the real
stack: mine pairs from Concord's own hybrid search, train a few steps, register, search with
the trained model, evaluate with it, and the same as a background job on the training queue.
A few steps teach the model nothing: these tests check the path, not the ranking quality
(the SciFact benchmark in the README measures that)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from evaluation import beir
from evaluation.harness import EvalOptions, eval_tenant, run_eval
from tests.helpers import TINY, key_headers, poster, suite_queue
from training.fine_tuning import TrainingOptions
from training.reranker import TrainingRefused, train_reranker

FEW_STEPS = TrainingOptions(max_steps=3, batch_size=8, rerank_window=5, mining_depth=10)


def _quiet(stage: str, done: int, total: int) -> None:
    pass


@pytest.fixture(scope="module")
def trained(worker: Any) -> dict[str, Any]:
    return train_reranker(TINY, "tiny-ce", FEW_STEPS, _quiet)


def test_training_refuses_the_test_split() -> None:
    options = TrainingOptions(split="test", max_steps=1)
    with pytest.raises(TrainingRefused, match="test split"):
        train_reranker(TINY, "never", options, _quiet)


def test_training_writes_a_model_card_and_registers_the_model(trained: dict[str, Any]) -> None:
    card = trained
    assert card["tenant"] == eval_tenant(beir.load(TINY))
    assert card["training"]["steps"] == 3
    data = card["data"]
    # 8 train queries: 1 held out for validation (10 %, at least one), 7 train; each has its
    # judged positives (13 judgements, all relevant) and up to 4 hard + 1 random negatives.
    assert data["queries_used_for_training"] == 7 and data["queries_held_out_for_validation"] == 1
    assert data["positive_pairs"] >= 7 and data["negative_pairs"] >= 7
    assert data["pairs"] == data["positive_pairs"] + data["negative_pairs"]
    assert card["validation"]["queries"] == 1 and card["validation"]["pairs_per_second"] > 0
    assert 0.0 <= card["validation"]["ndcg@10_reranked"] <= 1.0


def test_search_uses_the_trained_reranker_of_its_own_tenant_only(
    trained: dict[str, Any], client: TestClient
) -> None:
    headers = key_headers(trained["tenant"], ["read"])
    listed = client.get("/v1/rerankers", headers=headers).json()
    assert [r["name"] for r in listed] == ["tiny-ce"]
    assert "path" not in listed[0]  # the server's file layout is not the caller's business
    assert listed[0]["card"]["training"]["steps"] == 3

    body: dict[str, Any] = {
        "query": "rivers of ice carving valleys",
        "rerank": {"enabled": True, "window": 5, "model": "tiny-ce"},
        "explain": True,
    }
    response = client.post("/v1/search", json=body, headers=headers)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["degraded"] == []
    window = [r for r in payload["results"] if r["trace"]["rerank"] is not None]
    assert len(window) == min(5, len(payload["results"])) and window
    # By default the window is ordered by the blend validation chose; with blend 1 by the
    # reranker's own scores.
    alone = {**body, "rerank": {**body["rerank"], "blend": 1.0}}
    reranked = client.post("/v1/search", json=alone, headers=headers).json()["results"]
    scores = [r["scores"]["rerank"] for r in reranked if r["trace"]["rerank"] is not None]
    assert scores == sorted(scores, reverse=True) and len(scores) == len(window)
    assert {r["chunk_id"] for r in reranked[:5]} == {r["chunk_id"] for r in window}

    unknown = {**body, "rerank": {**body["rerank"], "model": "nope"}}
    assert client.post("/v1/search", json=unknown, headers=headers).status_code == 404
    stranger = key_headers("another-tenant", ["read"])
    assert client.post("/v1/search", json=body, headers=stranger).status_code == 404
    assert client.get("/v1/rerankers", headers=stranger).json() == []


def test_eval_reports_the_trained_reranker_next_to_the_untrained_configurations(
    trained: dict[str, Any], client: TestClient, tmp_path: Path
) -> None:
    options = EvalOptions(
        peer=False,
        abstain=False,
        rerank=False,
        reranker="tiny-ce",
        rerank_window=5,
        only=("hybrid_rrf", "hybrid_rrf+trained:tiny-ce"),
    )
    paths = run_eval(TINY, tmp_path, options, _quiet, http=poster(client))
    rows = {c["name"]: c for c in json.loads(paths["json"].read_text())["configs"]}
    assert rows["hybrid_rrf"]["rerank_stage_ms"] is None
    reranked = rows["hybrid_rrf+trained:tiny-ce"]
    assert reranked["unavailable"] is None
    assert reranked["metrics"]["queries"] == 8
    assert reranked["rerank_stage_ms"]["p95"] > 0
    assert "| hybrid_rrf+trained:tiny-ce |" in paths["markdown"].read_text()


def test_training_as_a_background_job_reports_progress_and_the_card(
    trained: dict[str, Any], client: TestClient
) -> None:
    from training.jobs import start_training_job

    options = TrainingOptions(max_steps=2, batch_size=8, rerank_window=5, mining_depth=10)
    job_id = start_training_job(TINY, "tiny-bg", options, queue=suite_queue())
    headers = key_headers(trained["tenant"], ["read"])
    deadline = time.monotonic() + 120
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["state"] in ("done", "failed"):
            break
        time.sleep(1)
    assert job["kind"] == "reranker_training"
    assert job["state"] == "done", job
    assert job["result"]["training"]["steps"] == 2
    assert job["progress"]["stages"]["train"] == {"done": 2, "total": 2}
    names = [r["name"] for r in client.get("/v1/rerankers", headers=headers).json()]
    assert names == ["tiny-bg", "tiny-ce"]
    # Another tenant cannot see the job.
    stranger = key_headers("another-tenant", ["read"])
    assert client.get(f"/v1/jobs/{job_id}", headers=stranger).status_code == 404


def test_revalidation_records_figures_and_the_blend_searches_use(
    trained: dict[str, Any], client: TestClient
) -> None:
    from training.reranker import BLENDS, revalidate_reranker

    card = revalidate_reranker(TINY, "tiny-ce", TrainingOptions(), _quiet)
    validation = card["validation"]
    assert validation["blend"] in BLENDS and "revalidated_at" in card
    assert validation["ndcg@10_blended"] == max(validation["ndcg@10_by_blend"].values())
    assert validation["ndcg@10_hybrid"] == validation["ndcg@10_by_blend"]["0.0"]
    listed = client.get("/v1/rerankers", headers=key_headers(card["tenant"], ["read"])).json()
    assert next(r for r in listed if r["name"] == "tiny-ce")["card"]["validation"] == validation
