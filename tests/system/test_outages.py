"""A store of the stack goes away and comes back: readiness follows it, nothing accepted is
lost, and everything heals without an operator (the suite's own Elasticsearch and Redis are
stopped, so these run in the system tier)."""

from __future__ import annotations

import signal
import time

from fastapi.testclient import TestClient
from sqlalchemy import select

from services.cli.stack import ElasticsearchService
from shared.db import unit_of_work
from shared.models import Chunk
from tests.conftest import wait_for
from tests.helpers import job_state, long_text, search, upload_text, wait_converged, wait_job


def test_readyz_follows_elasticsearch(client: TestClient, es_service: ElasticsearchService) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"]) == {"warm_up", "postgres", "elasticsearch", "redis"}
    es_service.down()
    try:
        unready = client.get("/readyz")
        assert unready.status_code == 503
        checks = unready.json()["checks"]
        assert not checks["elasticsearch"]["ok"] and checks["postgres"]["ok"]
        assert checks["warm_up"]["ok"]  # done: only the store holds readiness back
        assert client.get("/healthz").status_code == 200  # the process itself is fine
    finally:
        es_service.up()
    wait_for(lambda: client.get("/readyz").status_code == 200, 60, what="ready again")


def test_elasticsearch_outage_loses_nothing_and_heals_itself(
    client: TestClient, auth, tenant, worker, es_service
):
    es_service.down()
    try:
        jobs = [
            upload_text(client, auth, f"outage-{i}.txt", f"Outage note {i} about pelicans.")
            for i in range(5)
        ]
        for job in jobs:
            wait_job(client, auth, job["job_id"])  # Postgres side completes without ES
        degraded = search(client, auth, "pelicans")
        assert degraded["degraded"] == ["lexical_unavailable"]
        assert len(degraded["results"]) == 5
    finally:
        es_service.up()
    started = time.monotonic()
    chunks = wait_converged(tenant, timeout=90)
    assert len(chunks) == 5
    print(f"converged {time.monotonic() - started:.1f}s after Elasticsearch returned")
    assert search(client, auth, "pelicans", mode="lexical")["degraded"] == []


def test_killed_worker_and_emptied_redis_lose_nothing(
    client: TestClient, auth, tenant, worker, redis_service
):
    uploads = [
        upload_text(client, auth, f"kill-{i}.txt", long_text(f"walrus {i}", 12)) for i in range(12)
    ]
    wait_for(lambda: job_state(uploads[0]["job_id"])[0] in ("running", "indexed"), 60)
    worker.kill(signal.SIGKILL)
    redis_service.down()
    for leftover in redis_service.dir.glob("appendonly*"):
        if leftover.is_dir():
            for f in leftover.iterdir():
                f.unlink()
        else:
            leftover.unlink()
    redis_service.up()
    worker.start()
    for up in uploads:
        wait_job(client, auth, up["job_id"], timeout=150)
    chunks = wait_converged(tenant, timeout=60)
    with unit_of_work() as uow:
        per_doc = uow.session.execute(
            select(Chunk.document_id, Chunk.ordinal).where(Chunk.tenant_id == tenant)
        ).all()
    assert len(per_doc) == len(set(per_doc)) == len(chunks)
    assert sum(job_state(u["job_id"])[1]["chunks"] for u in uploads) == len(chunks)
