"""Recovery in seconds under the shipped default settings: a job held by a
process that died is taken over once its short lease runs out, because a live process renews
it by heartbeat; a retriable failure hands the job back at once instead of keeping it under
its lease. These tests run with the default lease and sweep (tests/conftest.py shortens
neither)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from shared.db import unit_of_work
from shared.ingest import pipeline
from shared.models import IngestJob
from shared.settings import Settings, get_settings
from shared.stores.compose import connect
from tests.conftest import ROOT, CeleryProcess, wait_for
from tests.helpers import (
    RecordingQueue,
    document_count,
    job_state,
    long_text,
    paused,
    upload_text,
    wait_converged,
)
from training import jobs as training_jobs

# A stand-in for a worker process: it claims a batch the way a task does, keeps it alive
# with the heartbeat, and then does nothing until it is killed.
HOLDER = """
import sys, time, uuid
from shared.ingest import pipeline
from shared.jobs.heartbeat import LeaseHeartbeat
from shared.settings import get_settings

from shared.db import unit_of_work
from shared.stores.compose import connect

with unit_of_work() as uow:
    claims = pipeline.claim(uow, uuid.UUID(sys.argv[1]), get_settings(), queue=connect().queue)
with LeaseHeartbeat([c.job_id for c in claims], unit_of_work, get_settings()):
    print(len(claims), flush=True)
    time.sleep(3600)
"""


def _attempts(job_ids: list[str]) -> dict[str, tuple[str, int]]:
    with unit_of_work() as uow:
        jobs = uow.session.query(IngestJob).filter(
            IngestJob.id.in_([uuid.UUID(j) for j in job_ids])
        )
        return {str(j.id): (j.state, j.attempts) for j in jobs}


def test_defaults_recover_a_killed_holder_in_seconds_and_never_steal_from_a_live_one(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    settings = Settings()  # what ships: the environment sets neither lease nor sweep
    assert settings.job_lease_seconds == get_settings().job_lease_seconds == 20
    assert settings.sweep_interval_seconds == get_settings().sweep_interval_seconds == 5
    with paused(worker):
        jobs = [
            upload_text(client, auth, f"held-{i}.txt", long_text(f"heron{i}", 8))["job_id"]
            for i in range(3)
        ]
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, jobs[0]],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env=os.environ.copy(),
        )
        assert holder.stdout is not None
        assert int(holder.stdout.readline()) == 3
    try:
        # Alive past two leases: the sweep (every 5 s) must leave its jobs alone.
        time.sleep(2 * settings.job_lease_seconds + settings.sweep_interval_seconds)
        assert _attempts(jobs) == {j: ("running", 1) for j in jobs}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    killed = time.monotonic()

    def all_indexed() -> bool:
        return all(state == "indexed" for state, _ in _attempts(jobs).values())

    wait_for(all_indexed, 90, interval=0.2, what="the dead holder's jobs to be taken over")
    taken_over_s = time.monotonic() - killed
    print(f"\n[killed holder] 3 jobs indexed {taken_over_s:.1f} s after SIGKILL (defaults)")
    # The lease left at the kill, one sweep period, then the work itself.
    assert taken_over_s <= settings.job_lease_seconds + 2 * settings.sweep_interval_seconds + 15
    assert {a for _, a in _attempts(jobs).values()} == {2}
    wait_converged(tenant)


def test_a_retriable_failure_hands_the_batch_back_for_its_retry_at_once(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreachable(uow: object, claims: object, vectors: object, queue: object) -> None:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    with paused(worker):
        first = upload_text(client, auth, "retry-a.txt", long_text("osprey", 6))["job_id"]
        mate = upload_text(client, auth, "retry-b.txt", long_text("plover", 6))["job_id"]
        monkeypatch.setattr(pipeline, "write_batch", unreachable)
        with pytest.raises(OperationalError):
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(first))
        # Neither job waits out a lease: the task's own job is queued for its retry, the
        # batch-mate queued with a message of its own.
        assert job_state(first)[0] == "queued" and job_state(mate)[0] == "queued"
        monkeypatch.undo()
        retried = pipeline.process_job(
            connect(), unit_of_work, uuid.UUID(first)
        )  # the retry, moments later
        assert retried.state == "indexed", retried
    wait_converged(tenant)
    assert job_state(mate)[0] == "indexed"


def test_a_silent_training_job_is_failed_or_published_again_by_the_sweep(
    client: TestClient, tenant: str, worker: CeleryProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training tasks are acknowledged on start, so nothing redelivers them: a running one
    whose worker died (no progress for TRAINING_LOST_AFTER) fails with the reason and its
    webhook, a queued one whose message was lost is published again, once per silence, and
    a live one is left alone."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from shared.db.repository import now
    from shared.jobs import sweep
    from shared.jobs.service import TRAINING_LOST_AFTER, TRAINING_MESSAGE_LOST_AFTER
    from shared.models import TrainingJob, WebhookDelivery
    from tests.helpers import key_headers

    hook = client.post(
        "/v1/admin/webhooks",
        json={"url": "http://127.0.0.1:9/hooks", "events": ["training.failed"]},
        headers=key_headers(tenant, ["admin"]),
    )
    assert hook.status_code == 201, hook.text
    ids = {state: uuid.uuid4() for state in ("dead", "lost-message", "live")}
    queue = RecordingQueue("publish_training_job", send=False)
    published = queue.calls["publish_training_job"]  # (job id,) each
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    with paused(worker):  # its beat-driven sweeps wait; this test runs the sweep itself
        with unit_of_work() as uow:
            for name, job_id in ids.items():
                state = "queued" if name == "lost-message" else "running"
                uow.session.add(
                    TrainingJob(
                        id=job_id, tenant_id=tenant, name=name, state=state, params={}, progress={}
                    )
                )
        with unit_of_work() as uow:
            current = now(uow.session)
            for name, silence in [
                ("dead", TRAINING_LOST_AFTER + timedelta(seconds=10)),  # six beats and one
                ("lost-message", TRAINING_MESSAGE_LOST_AFTER + timedelta(minutes=1)),
            ]:
                uow.session.execute(
                    update(TrainingJob)
                    .where(TrainingJob.id == ids[name])
                    .values(updated_at=current - silence)
                )
        # The first sweep after a gap (an outage of Postgres or Redis, or of the worker, which
        # silenced live runs' heartbeats as well) judges no running job yet.
        monkeypatch.setattr(sweep, "_reachable_since", hour_ago)
        monkeypatch.setattr(sweep, "_last_sweep", hour_ago)
        after_outage = sweep.sweep_expired_jobs(unit_of_work, queue)
        assert str(ids["dead"]) not in after_outage.training_failed
        # Sweeps without a gap for long: a running job silent for a minute is judged.
        monkeypatch.setattr(sweep, "_reachable_since", hour_ago)
        first = sweep.sweep_expired_jobs(unit_of_work, queue)
        again = sweep.sweep_expired_jobs(unit_of_work, queue)
        # A run that ended after the sweep settled it (it cannot, with its heartbeat) leaves
        # the sweep's verdict, and sends no second webhook.
        training_jobs._finish(ids["dead"], "done", queue=queue, result={})
        with unit_of_work() as uow:
            jobs = {j.name: j for j in uow.session.query(TrainingJob).filter_by(tenant_id=tenant)}
            events = [
                d.payload
                for d in uow.session.query(WebhookDelivery).filter_by(tenant_id=tenant)
                if d.event.startswith("training.")
            ]
            uow.session.query(TrainingJob).filter_by(tenant_id=tenant).delete()  # beat's sweeps
    mine = {str(i) for i in ids.values()}  # other tests' rows are not this test's to count
    assert [j for j in first.training_failed if j in mine] == [str(ids["dead"])]
    republished = after_outage.training_republished + first.training_republished
    assert [j for j in republished if j in mine] == [str(ids["lost-message"])]
    # once, after commit
    assert [j for (j,) in published if str(j) in mine] == [ids["lost-message"]]
    assert not mine & set(again.training_failed + again.training_republished)
    assert jobs["dead"].state == "failed" and "worker stopped" in (jobs["dead"].error or "")
    assert jobs["lost-message"].state == "queued" and jobs["live"].state == "running"
    assert [(e["training_job_id"], e["state"]) for e in events] == [(str(ids["dead"]), "failed")]


def test_a_training_run_silent_in_a_long_phase_keeps_its_heartbeat(
    tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some phases of a run report no progress for long (waiting for Elasticsearch, a graph
    build): a thread of the run writes its heartbeat all the same, so the sweep never fails
    a live run. (The beat is shortened here from 10 s to stay fast.)"""
    from datetime import timedelta

    from sqlalchemy import update

    from shared.db.repository import now
    from shared.models import TrainingJob

    monkeypatch.setattr(training_jobs, "HEARTBEAT_S", 0.2)
    job_id = uuid.uuid4()
    with unit_of_work() as uow:
        uow.session.add(
            TrainingJob(
                id=job_id, tenant_id=tenant, name="long", state="running", params={}, progress={}
            )
        )
    with unit_of_work() as uow:
        stale = now(uow.session) - timedelta(hours=1)
        uow.session.execute(
            update(TrainingJob).where(TrainingJob.id == job_id).values(updated_at=stale)
        )
    with training_jobs._heartbeat(job_id):
        time.sleep(1.0)  # a phase that reports nothing
    with unit_of_work() as uow:
        job = uow.session.get(TrainingJob, job_id)
        assert job is not None and now(uow.session) - job.updated_at < timedelta(seconds=5)
        uow.session.delete(job)


def test_upload_events_held_by_a_killed_worker_are_handed_back_in_seconds(
    tmp_path: Path, tenant: str, worker: CeleryProcess
) -> None:
    """A worker's main process SIGKILLed while its child accepts a message of upload events:
    nothing is left to hand the message back, and kombu would restore it only after the
    broker's visibility timeout (an hour). The sweep hands it back once the dead worker's
    alive key has expired (workers/deliveries.py), under the shipped defaults, and every
    event is accepted and indexed."""
    import socket

    from shared.documents.events import build_upload_event
    from shared.queue import INGEST_QUEUE, publish_upload_events
    from shared.redis_client import redis_client
    from tests.conftest import celery_worker_command
    from workers import deliveries

    settings = Settings()  # what ships
    assert settings.broker_visibility_timeout_s == 3600 and settings.sweep_interval_seconds == 5

    class IngestOnlyWorker(CeleryProcess):
        def argv(self) -> list[str]:
            return celery_worker_command([INGEST_QUEUE], 1, self.node)

    r = redis_client(2.0)
    doomed = IngestOnlyWorker("worker", tmp_path)
    name = doomed.node.replace("%h", socket.gethostname())
    n = 150
    events = [
        build_upload_event(
            tenant_id=tenant, external_id=f"held-{i}.txt", raw=long_text(f"gannet{i}", 40).encode()
        )
        for i in range(n)
    ]
    with paused(worker):  # only the doomed worker takes the message
        doomed.start()
        try:

            def doomed_holder() -> str | None:  # this start of the doomed worker, once up
                ids = [h.decode() for h in r.smembers(deliveries.WORKERS)]
                up = [h for h in ids if h.startswith(name + "/") and r.exists(deliveries.ALIVE + h)]
                return up[0] if up else None

            holder = wait_for(doomed_holder, 180, what="the worker to be up")
            publish_upload_events(events)
            held = wait_for(
                lambda: r.hkeys(deliveries.HOLDING + holder) or None,
                60,
                interval=0.02,
                what="the worker to take the message",
            )
        finally:
            doomed.kill()  # the main process and its child, mid-task
        killed = time.monotonic()
        tag = held[0].decode()
        # Restarted at once under the same name (as a container is): another holder, which
        # must not make the dead one's message look held.
        (tmp_path / "successor").mkdir()
        successor = IngestOnlyWorker("worker", tmp_path / "successor", node=doomed.node)
        successor.start()
        assert r.hexists("unacked", tag)  # taken, not acknowledged: the task was still running
        at_kill = document_count(tenant)
        assert at_kill < n  # the rest can only come from the message handed back
    try:
        wait_for(lambda: document_count(tenant) == n, 120, interval=0.2, what="all accepted")
    finally:
        successor.stop()
    handed_back_s = time.monotonic() - killed
    print(
        f"\n[killed worker's upload events] {at_kill} of {n} accepted at the kill, all "
        f"{handed_back_s:.1f} s after it"
    )
    # The alive key's lifetime, then a sweep, then the message's own work.
    assert handed_back_s < deliveries.ALIVE_TTL_S + 2 * settings.sweep_interval_seconds + 30
    assert not r.hexists("unacked", tag)
    assert not r.sismember(deliveries.WORKERS, holder)  # the dead holder is forgotten
    # then the suite's worker indexes all 150 (a minute at times, on two loaded cores)
    wait_converged(tenant, timeout=180)
