"""The answerability model: its fitting, calibration and thresholds (pure), the policy's three
decisions (pure), then ``concord answerability train`` end to end on the tiny BEIR dataset
through the real stack: trained, registered, its card served, used by a search (abstain,
verify or answer, with the probability and features in the decision), compared by
``concord eval``, and the test split refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from evaluation import beir
from evaluation.harness import EvalOptions, eval_tenant, run_eval
from shared.answerability import model as learn
from shared.answerability import service as answerability
from shared.answerability.features import (
    FEATURE_NAMES,
    RERANK_FEATURE_NAMES,
)
from shared.db import unit_of_work
from shared.errors import NotFound
from shared.rerankers import service as rerankers
from shared.search import decide as decide_stage
from shared.search import rerank as rerank_stage
from tests.helpers import TINY, key_headers, poster
from training.answerability import AnswerabilityOptions, train_answerability
from training.fine_tuning import TrainingOptions
from training.reranker import TrainingRefused, train_reranker


def _quiet(stage: str, done: int, total: int) -> None:
    pass


# --- the model (pure) -------------------------------------------------------------------


# --- the policy's decisions (pure) ------------------------------------------------------


# --- end to end through the real stack --------------------------------------------------


@pytest.mark.usefixtures("worker")
def test_trained_registered_served_and_used_by_search_and_eval(
    client: TestClient, tmp_path: Path
) -> None:
    card = train_answerability(TINY, "default", AnswerabilityOptions(), _quiet)
    tenant = eval_tenant(beir.load(TINY))
    assert card["tenant"] == tenant and card["queries"] == 8
    assert card["examples"] == {"answerable": 8, "unanswerable": 8}
    assert card["chosen"] in {v.label for v in learn.VARIANTS}
    assert len(card["model_selection"]) == len(learn.VARIANTS)
    assert 0.0 <= card["validation"]["false_abstain"] <= 0.05
    assert card["inference_us_per_query"] < 2000
    assert set(card["linear_weights"]) == set(FEATURE_NAMES)

    headers = key_headers(tenant, ["read"])
    served = client.get("/v1/answerability-models/default", headers=headers)
    assert served.status_code == 200, served.text
    thresholds = served.json()["thresholds"]
    assert thresholds["abstain"] <= thresholds["answer"]
    assert served.json()["card"]["chosen"] == card["chosen"]
    # Another tenant neither lists nor selects it.
    other = key_headers("someone-else", ["read"])
    assert client.get("/v1/answerability-models", headers=other).json() == []
    body = {"query": "rivers of ice carving valleys", "policy": {"score_type": "answerability"}}
    assert client.post("/v1/search", json=body, headers=other).status_code == 404

    response = client.post("/v1/search", json=body, headers=headers)
    assert response.status_code == 200, response.text
    decision = response.json()["decision"]
    judged = decision["answerability"]
    assert decision["score_type"] == "answerability" and judged["model"] == "default"
    assert decision["top_score"] == judged["probability"]
    assert decision["threshold"] == thresholds["abstain"]
    assert set(judged["features"]) == set(FEATURE_NAMES)
    expected = (
        "abstain"
        if judged["probability"] < thresholds["abstain"]
        else "verify"
        if judged["probability"] < thresholds["answer"]
        else "answerable"
    )
    assert decision["status"] == expected
    # The decision reorders nothing: the same results as the default policy's.
    plain = client.post("/v1/search", json={"query": body["query"]}, headers=headers).json()
    assert [r["chunk_id"] for r in plain["results"]] == [
        r["chunk_id"] for r in response.json()["results"]
    ]
    # The thresholds can be overridden per request, and the model needs both arms.
    p = judged["probability"]

    def decided(**policy: float) -> dict[str, Any]:
        changed = {**body, "policy": {"score_type": "answerability", **policy}}
        answer = client.post("/v1/search", json=changed, headers=headers)
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["decision"])

    lowered = decided(min_score=0.0, verify_below=1.0)
    assert (lowered["threshold"], lowered["verify_below"]) == (0.0, 1.0)
    assert lowered["status"] == ("verify" if p < 1.0 else "answerable")
    raised = decided(min_score=1.0)
    assert raised["threshold"] == 1.0
    assert raised["status"] == ("abstain" if p < 1.0 else "answerable")
    dense_only = {**body, "mode": "dense"}
    refused = client.post("/v1/search", json=dense_only, headers=headers)
    assert refused.status_code == 400 and "hybrid" in refused.json()["error"]["message"]

    options = EvalOptions(peer=False, rerank=False)
    paths = run_eval(TINY, tmp_path, options, _quiet, http=poster(client))
    report = json.loads(paths["json"].read_text())
    policies = {p["policy"]: p for p in report["abstain"]["policies"]}
    assert set(policies) == {"dense_cosine (defaults)", "answerability:default"}
    for p in policies.values():
        assert 0.0 <= p["auc"] <= 1.0 and p["curve"][-1]["abstain_recall"] == 1.0
        assert p["best_within_5pct_false_abstain"]["false_abstain"] <= 0.05
    assert paths["abstain_roc_png"].read_bytes()[:4] == b"\x89PNG"
    assert "| answerability:default |" in paths["markdown"].read_text()

    from typer.testing import CliRunner

    from services.cli.main import app

    removed = CliRunner().invoke(app, ["answerability", "delete", "default", "--tenant", tenant])
    assert removed.exit_code == 0, removed.output
    assert client.get("/v1/answerability-models", headers=headers).json() == []


@pytest.fixture
def models_removed_afterwards() -> Iterator[None]:
    """The tiny dataset's tenant is shared with the reranker tests, which list its models:
    what the test registers there goes again afterwards, whether it passed or not."""
    yield
    tenant = eval_tenant(beir.load(TINY))
    with unit_of_work() as uow:
        for entry in rerankers.list_for_tenant(uow.session, tenant):
            if entry.name in ("ce-first-3", "ce-first-4"):
                rerankers.remove_files(rerankers.delete(uow.session, tenant, entry.name))
        for model in answerability.list_for_tenant(uow.session, tenant):
            if model.name == "with-ce":
                answerability.delete(uow.session, tenant, model.name)


@pytest.mark.usefixtures("worker", "models_removed_afterwards")
def test_a_model_reading_a_trained_reranker_trains_on_queries_the_reranker_never_saw(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny dataset has 8 judged train queries: a reranker trained on the first 3 leaves 5
    (one per fold); one trained on the first 4 leaves too few, and training says so."""
    few_steps = TrainingOptions(max_steps=2, batch_size=8, rerank_window=5, mining_depth=10)
    train_reranker(TINY, "ce-first-3", replace(few_steps, max_queries=3), _quiet)
    train_reranker(TINY, "ce-first-4", replace(few_steps, max_queries=4, max_steps=1), _quiet)
    with pytest.raises(TrainingRefused, match="leaves 4 it never saw"):
        train_answerability(TINY, "never", AnswerabilityOptions(reranker="ce-first-4"), _quiet)

    card = train_answerability(TINY, "with-ce", AnswerabilityOptions(reranker="ce-first-3"), _quiet)
    assert card["reranker"] == "ce-first-3"
    assert card["queries_skipped_as_seen_by_the_reranker"] == 3 and card["queries"] == 5
    assert set(card["linear_weights"]) == set(FEATURE_NAMES) | set(RERANK_FEATURE_NAMES)

    tenant = eval_tenant(beir.load(TINY))
    headers = key_headers(tenant, ["read"])
    body = {
        "query": "rivers of ice carving valleys",
        "policy": {"score_type": "answerability", "answerability_model": "with-ce"},
    }
    judged_alone = client.post("/v1/search", json=body, headers=headers)
    assert judged_alone.status_code == 200, judged_alone.text
    decision = judged_alone.json()["decision"]
    judged = decision["answerability"]
    assert set(judged["features"]) == set(FEATURE_NAMES) | set(RERANK_FEATURE_NAMES)
    assert decision["top_score"] == judged["probability"]
    assert (
        "answerability"
        in client.post("/v1/search", json={**body, "explain": True}, headers=headers).json()[
            "timings_ms"
        ]
    )
    # The judgement reorders nothing.
    plain = client.post("/v1/search", json={"query": body["query"]}, headers=headers).json()
    assert [r["chunk_id"] for r in plain["results"]] == [
        r["chunk_id"] for r in judged_alone.json()["results"]
    ]
    # A search that reranks with the same model over the window reuses its scores (the model
    # runs once, in the rerank stage): the same judgement as scoring the first results apart.
    scorings: list[int] = []
    score = rerank_stage.rerank_within_budget

    def counted(*args: Any, **kwargs: Any) -> list[float]:
        scorings.append(1)
        return score(*args, **kwargs)

    for stage in (rerank_stage, decide_stage):  # the rerank stage's, and the judge's own
        monkeypatch.setattr(stage, "rerank_within_budget", counted)
    reranked = {**body, "rerank": {"enabled": True, "model": "ce-first-3", "window": 10}}
    reused = client.post("/v1/search", json=reranked, headers=headers)
    assert reused.status_code == 200, reused.text
    assert len(scorings) == 1
    assert client.post("/v1/search", json=body, headers=headers).status_code == 200
    assert len(scorings) == 2  # without the rerank stage, the judgement scores them itself
    reused_judged = reused.json()["decision"]["answerability"]
    for name in RERANK_FEATURE_NAMES:
        assert reused_judged["features"][name] == pytest.approx(judged["features"][name], abs=1e-3)
    assert reused_judged["probability"] == pytest.approx(judged["probability"], abs=1e-3)

    with pytest.raises(NotFound):
        train_answerability(TINY, "never", AnswerabilityOptions(reranker="no-such"), _quiet)
    # The reranker trained again under its name gives other scores: the model says it is out
    # of date rather than judge with scores it never saw.
    train_reranker(TINY, "ce-first-3", replace(few_steps, max_queries=3, max_steps=1), _quiet)
    stale = client.post("/v1/search", json=body, headers=headers)
    assert stale.status_code == 409 and "train the model again" in stale.text
    # Without the reranker it reads, the model cannot judge: a clear 404, not a guess.
    with unit_of_work() as uow:
        rerankers.delete(uow.session, tenant, "ce-first-3")
    gone = client.post("/v1/search", json=body, headers=headers)
    assert gone.status_code == 404
    assert "reranker 'ce-first-3'" in gone.json()["error"]["message"]
