"""Prometheus metrics: queue depths, the outbox backlog, dead letters and stage timings,
from the real stack."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_metrics_cover_queue_outbox_dead_letters_and_stages(client: TestClient, worker):
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
