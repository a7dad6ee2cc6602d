"""Workers on many hosts: two worker "hosts" (separate processes with node names and
state directories of their own, sharing nothing but the broker and the database) take one
ingest between them; one is killed mid-ingest, and the other finishes every job under the
shipped lease and sweep defaults (nothing in the environment shortens them)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from shared.db import unit_of_work
from shared.models import IngestJob
from shared.queue import PROCESS_JOB_TASK
from shared.settings import Settings
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import (
    document_count,
    jobs_in_flight,
    long_text,
    paused,
    upload_text,
    wait_converged,
)

DOCUMENTS = 96


def _ingest_tasks(host: CeleryProcess, event: str) -> int:
    """The host's ingest batches that were ``received`` or ``succeeded`` (its own log, in its
    own directory)."""
    if not host.log.exists():
        return 0
    return sum(
        1
        for line in host.log.read_text(errors="replace").splitlines()
        if PROCESS_JOB_TASK in line and event in line  # process_job and process_jobs
    )


def test_two_worker_hosts_share_an_ingest_and_the_survivor_finishes_it(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
    tmp_path: Path,
) -> None:
    defaults = Settings()
    assert (defaults.job_lease_seconds, defaults.sweep_interval_seconds) == (20, 5)
    hosts: dict[str, CeleryProcess] = {}
    for name in ("host-a", "host-b"):
        state = tmp_path / name / "state"  # per host (the ONNX export is the suite's one)
        state.mkdir(parents=True)
        hosts[name] = CeleryProcess(
            "worker", tmp_path / name, {"CONCORD_STATE_DIR": str(state)}, f"concord@{name}"
        )
    with paused(worker):  # only the two hosts take this ingest
        for host in hosts.values():
            host.start()
        try:
            for i in range(DOCUMENTS):
                upload_text(client, auth, f"doc-{i}", long_text(f"topic {i}", 60))
            # Host A is mid-ingest: it has finished a job and taken the next ones.
            wait_for(
                lambda: _ingest_tasks(hosts["host-a"], "succeeded") > 0,
                120,
                what="host-a to finish an ingest job",
            )
            hosts["host-a"].kill(signal.SIGKILL)
            killed_at = time.monotonic()
            in_flight = jobs_in_flight(tenant)
            chunks = wait_converged(tenant, timeout=120)
            recovered_s = time.monotonic() - killed_at
        finally:
            for host in hosts.values():
                host.stop()
    print(
        f"two hosts, one killed mid-ingest with {in_flight} jobs in flight: converged "
        f"{recovered_s:.1f} s after the kill"
    )
    assert in_flight > 0  # the kill was mid-ingest
    assert document_count(tenant) == DOCUMENTS
    # Every document has its chunks (ids are "<document id>:<ordinal>"), and every job ended
    # indexed: none lost with the killed host, none dead-lettered.
    assert len({cid.split(":")[0] for cid in chunks}) == DOCUMENTS
    assert _job_states(tenant) == {"indexed": DOCUMENTS}
    assert _ingest_tasks(hosts["host-b"], "succeeded") > 0  # the survivor finished the rest


def _job_states(tenant: str) -> dict[str, int]:
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(IngestJob.state, func.count())
            .where(IngestJob.tenant_id == tenant)
            .group_by(IngestJob.state)
        ).all()
    return {state: int(n) for state, n in rows}
