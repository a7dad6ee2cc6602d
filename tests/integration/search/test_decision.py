"""The default decision on a real corpus: casual wording of a question its corpus answers is
answered, a question about what it does not hold is not."""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi.testclient import TestClient

from tests.helpers import search, wait_converged, wait_job

DEMO = Path(__file__).resolve().parents[3] / "demo" / "corpus"


def _upload_demo_corpus(client: TestClient, auth: dict[str, str]) -> None:
    jobs = []
    for path in sorted(DEMO.iterdir()):
        content_type = mimetypes.guess_type(path.name)[0] or "text/plain"
        response = client.post(
            "/v1/documents",
            headers=auth,
            data={"external_id": path.name, "title": path.stem},
            files={"file": (path.name, path.read_bytes(), content_type)},
        )
        assert response.status_code == 202, response.text
        jobs.append(response.json()["job_id"])
    for job in jobs:
        wait_job(client, auth, job)


def test_the_demos_casual_question_is_answered_and_a_question_beside_it_is_not(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    """The demo's fourth search abstained (query_terms_absent: "yeast", a word the corpus
    never uses) while its first result said "Feed the starter ... once a day"."""
    _upload_demo_corpus(client, auth)
    wait_converged(tenant)
    casual = search(client, auth, "how often must I feed my bread yeast culture", top_k=3)
    assert casual["results"][0]["external_id"] == "sourdough.html"
    assert casual["decision"]["status"] == "answerable", casual["decision"]
    assert "once a day" in casual["evidence"]["items"][0]["text"]
    # a question the corpus cannot answer still abstains, naming the name it lacks
    missing = search(client, auth, "how do I restore a backup made with borgbackup", top_k=3)
    assert missing["decision"]["status"] == "abstain", missing["decision"]
