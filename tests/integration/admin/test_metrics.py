"""Prometheus metrics: queue depths, the outbox backlog, dead letters and stage timings,
from the real stack."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers import upload_text, wait_job


def test_metrics_cover_queue_outbox_dead_letters_and_stages(client: TestClient, auth, worker):
    # one indexed job of its own: the stage figures are read from the jobs' recorded timings
    job = upload_text(client, auth, "metrics.txt", "Stage timings come from indexed jobs.")
    wait_job(client, auth, job["job_id"])
    body = client.get("/metrics").text
    for name in (
        "concord_queue_depth",
        "concord_outbox_backlog",
        "concord_dead_letters",
        "concord_ingest_stage_seconds_count",
        "concord_jobs",
    ):
        assert name in body, name
    assert 'concord_ingest_stage_seconds_count{stage="embed"}' in body
