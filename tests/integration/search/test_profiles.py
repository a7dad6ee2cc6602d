"""Search profiles: written by concord tune, used by search and eval, refused when invalid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evaluation import beir
from evaluation.harness import EvalOptions, eval_tenant, run_eval
from evaluation.tune import TuningRefused, tune
from tests.helpers import TINY, key_headers, poster, progress_log


@pytest.mark.usefixtures("worker")
def test_tune_writes_a_profile_that_search_and_eval_use(client: TestClient, tmp_path: Path) -> None:
    _, progress = progress_log()
    with pytest.raises(TuningRefused, match="test split"):
        tune(TINY, "test", "tuned", progress)

    result = tune(TINY, "train", "tuned", progress)
    assert result["queries"] == 8
    assert result["train_ndcg@10"]["tuned"] >= result["train_ndcg@10"]["defaults"]
    assert 0.0 <= result["threshold"]["false_abstain"] <= 0.05

    tenant = eval_tenant(beir.load(TINY))
    headers = key_headers(tenant, ["read"])
    profile = client.get("/v1/profiles/tuned", headers=headers).json()
    assert profile["settings"]["fusion"] == result["settings"]["fusion"]

    body = {"query": "rivers of ice carving valleys", "profile": "tuned", "explain": True}
    response = client.post("/v1/search", json=body, headers=headers)
    assert response.status_code == 200, response.text
    decision = response.json()["decision"]
    assert decision["threshold"] == result["settings"]["policy"]["min_score"]
    # A request's own field replaces the profile's.
    override = {**body, "policy": {"min_score": 0.99}}
    assert (
        client.post("/v1/search", json=override, headers=headers).json()["decision"]["threshold"]
        == 0.99
    )
    missing = client.post("/v1/search", json={**body, "profile": "nope"}, headers=headers)
    assert missing.status_code == 404

    with_profile = EvalOptions(peer=False, rerank=False, profile="tuned")
    paths = run_eval(TINY, tmp_path, with_profile, progress, http=poster(client))
    report = json.loads(paths["json"].read_text())
    assert report["configs"][-2]["name"] == "profile:tuned"
    assert report["configs"][-2]["metrics"]["queries"] == 8
    assert [row["policy"] for row in report["abstain"]["served"]] == ["defaults", "profile:tuned"]


def test_profiles_reject_invalid_settings(client: TestClient) -> None:
    headers = key_headers("profile-tenant", ["admin"])
    bad = client.put("/v1/profiles/p1", json={"settings": {"top_k": 0}}, headers=headers)
    assert bad.status_code == 422 and "top_k" in bad.text
    misplaced = client.put("/v1/profiles/p1", json={"settings": {"query": "x"}}, headers=headers)
    assert misplaced.status_code == 422 and "query" in misplaced.text
    good = client.put("/v1/profiles/p1", json={"settings": {"mode": "lexical"}}, headers=headers)
    assert good.status_code == 200 and good.json()["settings"] == {"mode": "lexical"}
    assert client.delete("/v1/profiles/p1", headers=headers).status_code == 204
    assert client.get("/v1/profiles/p1", headers=headers).status_code == 404
