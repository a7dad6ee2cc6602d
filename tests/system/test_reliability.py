"""The reliability suite: faults injected into the real stack, then the same three figures
after every scenario: **lost** (accepted uploads not indexed in both stores once the stores
have converged), **duplicates** (more than one chunk for a (document, ordinal) in either
store), **orphans** (Elasticsearch documents that are not live chunks in Postgres), plus the
time to converge after the fault ended.

CI runs the CI size; ``CONCORD_RELIABILITY_SIZE=large`` runs the larger manual size. Every
scenario prints its figures and appends them to ``test-artifacts/reliability/figures.jsonl``.
Run only this suite with ``pytest -m reliability``."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from elasticsearch import Elasticsearch
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from shared.db import unit_of_work
from shared.db.repository import count_rows
from shared.models import Chunk, DeadLetter, Document, IngestJob, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.relay import service as relay
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.conftest import CeleryProcess, wait_for
from tests.faults import BulkFaultProxy, BulkFaults
from tests.helpers import key_headers, paused, tenant_index, upload_text, wait_converged

pytestmark = pytest.mark.reliability

LARGE = os.environ.get("CONCORD_RELIABILITY_SIZE", "ci") == "large"
ARTIFACTS = Path(os.environ.get("CONCORD_TEST_ARTIFACTS", "test-artifacts")) / "reliability"


@dataclass
class Figures:
    scenario: str
    accepted: int
    lost: int
    duplicates: int
    orphans: int
    converged_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self) -> None:
        print(
            f"\n[{self.scenario}] accepted {self.accepted}, lost {self.lost}, duplicates "
            f"{self.duplicates}, orphans {self.orphans}, converged {self.converged_s:.1f} s "
            f"after the fault; {json.dumps(self.extra)}"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with (ARTIFACTS / "figures.jsonl").open("a") as out:
            out.write(json.dumps({"size": "large" if LARGE else "ci", **asdict(self)}) + "\n")


def measure(
    scenario: str,
    tenant: str,
    accepted: dict[str, int],
    fault_ended: float,
    timeout: float,
    **extra: Any,
) -> Figures:
    """Wait for the stores to converge, then count. ``accepted``: document id -> the version
    the API accepted (a later version of the same document also counts as indexed)."""
    wait_converged(tenant, timeout=timeout)
    converged_s = time.monotonic() - fault_ended
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.id, Chunk.document_id, Chunk.ordinal, Chunk.version).where(
                Chunk.tenant_id == tenant
            )
        ).all()
        docs = {
            str(d.id): d
            for d in uow.session.scalars(select(Document).where(Document.tenant_id == tenant))
        }
    es = get_es()
    alias = get_settings().es_chunks_alias()
    es.indices.refresh(index=alias)
    hits = es.search(
        index=alias,
        query={"term": {"tenant_id": tenant}},
        size=10_000,
        version=True,
        source_includes=["document_id", "ordinal"],
    )["hits"]["hits"]
    pg_live = {cid: version for cid, _, _, version in rows}
    es_docs = {h["_id"]: h for h in hits}
    pg_by_doc = Counter(str(doc) for _, doc, _, _ in rows)
    es_by_doc = Counter(h["_source"]["document_id"] for h in hits)

    lost = 0
    for doc_id, version in accepted.items():
        doc = docs.get(doc_id)
        indexed = (
            doc is not None
            and doc.version >= version
            and (doc.deleted or (pg_by_doc[doc_id] > 0 and es_by_doc[doc_id] == pg_by_doc[doc_id]))
        )
        lost += not indexed
    pg_dup = sum(n - 1 for n in Counter((d, o) for _, d, o, _ in rows).values() if n > 1)
    es_dup = sum(
        n - 1
        for n in Counter(
            (h["_source"]["document_id"], h["_source"]["ordinal"]) for h in hits
        ).values()
        if n > 1
    )
    orphans = sum(
        1 for cid, h in es_docs.items() if cid not in pg_live or h["_version"] != pg_live[cid]
    )
    figures = Figures(scenario, len(accepted), lost, pg_dup + es_dup, orphans, converged_s, extra)
    figures.report()
    return figures


def assert_clean(figures: Figures, within_s: float) -> None:
    assert (figures.lost, figures.duplicates, figures.orphans) == (0, 0, 0), figures
    assert figures.converged_s <= within_s, figures


def _text(i: int, topic: str) -> str:
    return (
        f"Record {i} on {topic}. It notes observation {i * 7 % 13} and sample {i}. "
        f"A second sentence about {topic} keeps the chunk realistic in length."
    )


def _upload_many(
    client: TestClient, auth: dict[str, str], n: int, topic: str, accepted: dict[str, int]
) -> None:
    for i in range(n):
        up = upload_text(client, auth, f"{topic}-{i}.txt", _text(i, topic))
        accepted[up["document_id"]] = up["version"]


# --- 1. SIGKILL workers mid-ingest -----------------------------------------------------------


def test_sigkilled_workers_lose_nothing(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    n, kills = (1000, 20) if LARGE else (200, 5)
    rng = random.Random(11)
    accepted: dict[str, int] = {}
    uploader = threading.Thread(target=_upload_many, args=(client, auth, n, "kill", accepted))
    uploader.start()
    killed = Counter[str]()

    def supervise() -> None:
        # As the deployment's supervisor does (compose `restart: unless-stopped`): a worker
        # whose pool child died while the worker itself was still starting exits with
        # "Could not start worker processes", and is started again.
        if worker.proc is None or worker.proc.poll() is not None:
            worker.start()
            killed["restarted by the supervisor"] += 1

    for k in range(kills):
        time.sleep(rng.uniform(0.5, 3.0))
        supervise()
        children = worker.child_pids()
        if k % 2 == 0 and children:
            os.kill(rng.choice(children), signal.SIGKILL)  # the pool child; main respawns it
            killed["pool child"] += 1
        else:
            worker.kill(signal.SIGKILL)  # the main process and its children
            worker.start()
            killed["main process"] += 1
    last_kill = time.monotonic()
    uploader.join()
    for _ in range(10):  # a kill during start-up may take the worker down a moment later
        time.sleep(1)
        supervise()
    figures = measure(
        "sigkill", tenant, accepted, last_kill, timeout=180 if LARGE else 60, kills=dict(killed)
    )
    with unit_of_work() as uow:
        attempts = uow.session.scalars(
            select(IngestJob.attempts).where(IngestJob.tenant_id == tenant)
        ).all()
        letters = uow.session.scalars(
            select(DeadLetter.id).where(DeadLetter.tenant_id == tenant)
        ).all()
    figures.extra["max_attempts"] = max(attempts)
    print(f"max attempts of a job: {max(attempts)} (limit {get_settings().job_max_attempts})")
    assert max(attempts) <= get_settings().job_max_attempts and not letters
    assert_clean(figures, 180 if LARGE else 60)


# --- 2. A worker stopped past the broker's visibility timeout ----------------------------------

SHORT_VISIBILITY = {
    "CONCORD_BROKER_VISIBILITY_TIMEOUT_S": "8",
    "CONCORD_TASK_SOFT_TIME_LIMIT_S": "5",
    "CONCORD_TASK_TIME_LIMIT_S": "6",
}


@pytest.fixture
def short_visibility_workers(
    tmp_path: Path, worker: CeleryProcess
) -> Iterator[list[CeleryProcess]]:
    """Two workers whose broker redelivers unacknowledged messages after 8 s; the session
    worker is paused meanwhile so that only these two take the work."""
    extra = [CeleryProcess("worker", tmp_path / name, SHORT_VISIBILITY) for name in ("a", "b")]
    for w in extra:
        w.log.parent.mkdir()
        w.start()
    with paused(worker):
        yield extra
    for w in extra:
        w.stop()


def test_a_worker_stopped_past_the_visibility_timeout_duplicates_no_chunk(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    short_visibility_workers: list[CeleryProcess],
) -> None:
    stopped, _ = short_visibility_workers
    n = 150 if LARGE else 40
    accepted: dict[str, int] = {}
    _upload_many(client, auth, n, "visibility", accepted)
    time.sleep(3)  # both workers are busy
    os.killpg(stopped.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    time.sleep(25)  # past the visibility timeout (8 s) and the job lease (20 s)
    os.killpg(stopped.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
    resumed = time.monotonic()
    # Updates while versions race: every document gets a second version.
    for doc_id in list(accepted)[: n // 4]:
        i = list(accepted).index(doc_id)
        up = upload_text(client, auth, f"visibility-{i}.txt", _text(i, "visibility") + " v2")
        accepted[doc_id] = up["version"]
    figures = measure("visibility-timeout", tenant, accepted, resumed, timeout=120)
    with unit_of_work() as uow:
        repeated = uow.session.scalars(
            select(IngestJob.attempts).where(IngestJob.tenant_id == tenant, IngestJob.attempts > 1)
        ).all()
    figures.extra["jobs_executed_more_than_once"] = len(repeated)
    print(f"jobs executed more than once: {len(repeated)}")
    assert_clean(figures, 120)  # orphans include any Elasticsearch version regression


# --- 3. Redis killed mid-ingest and restarted empty -----------------------------------------


def test_redis_restarted_empty_loses_no_accepted_upload(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess, redis_service: Any
) -> None:
    n = 300 if LARGE else 60
    accepted: dict[str, int] = {}
    _upload_many(client, auth, n // 2, "redis", accepted)
    redis_service.down()
    for leftover in redis_service.dir.glob("appendonly*"):
        for f in leftover.iterdir() if leftover.is_dir() else [leftover]:
            f.unlink()
    _upload_many(client, auth, n // 2, "redis-down", accepted)  # still accepted: Postgres has them
    redis_service.up()
    returned = time.monotonic()
    sweep_period = get_settings().sweep_interval_seconds

    def republished() -> bool:
        # Every job Redis forgot has been published again (its lease restarted) or is done.
        with unit_of_work() as uow:
            waiting = uow.session.scalar(
                select(func.count())
                .select_from(IngestJob)
                .where(
                    IngestJob.tenant_id == tenant,
                    IngestJob.state == "queued",
                    IngestJob.lease_expires_at
                    < func.now()
                    - timedelta(seconds=time.monotonic() - returned)
                    + timedelta(seconds=get_settings().queued_republish_seconds),
                )
            )
        return waiting == 0

    wait_for(republished, 60, interval=0.2, what="the sweep to republish what Redis lost")
    republished_s = time.monotonic() - returned
    figures = measure(
        "redis-restarted-empty",
        tenant,
        accepted,
        returned,
        timeout=180,
        sweep_period_s=sweep_period,
        republished_s=round(republished_s, 1),
    )
    # Recovery starts within two sweep periods (plus the broker reconnect); converging also
    # takes the time one worker needs to process the backlog, which the figures report.
    assert republished_s <= 2 * sweep_period + 5, figures
    assert_clean(figures, 180)


# --- 4. Elasticsearch unreachable during ingest and queries ----------------------------------


def test_elasticsearch_down_for_a_minute_degrades_and_heals(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess, es_service: Any
) -> None:
    n = 200 if LARGE else 40
    outage_s = 60
    accepted: dict[str, int] = {}
    statuses: Counter[int] = Counter()
    upload_statuses: Counter[int] = Counter()
    degraded = 0
    es_service.down()
    try:
        deadline = time.monotonic() + outage_s
        i = 0
        while time.monotonic() < deadline:
            if i < n:
                up = client.post(
                    "/v1/documents",
                    headers=auth,
                    json={"external_id": f"es-down-{i}.txt", "text": _text(i, "es-down")},
                )
                statuses[up.status_code] += 1
                upload_statuses[up.status_code] += 1
                if up.status_code == 202:
                    accepted[up.json()["document_id"]] = up.json()["version"]
                i += 1
            found = client.post("/v1/search", headers=auth, json={"query": "es-down record"})
            statuses[found.status_code] += 1
            degraded += "lexical_unavailable" in found.json().get("degraded", [])
            time.sleep(0.5)
    finally:
        es_service.up()
    returned = time.monotonic()
    figures = measure(
        "elasticsearch-down-60s",
        tenant,
        accepted,
        returned,
        timeout=120 if LARGE else 30,
        statuses=dict(statuses),
        degraded_searches=degraded,
    )
    assert not [s for s in statuses if s >= 500], statuses
    assert degraded > 0 and upload_statuses == {202: len(accepted)}, upload_statuses
    assert_clean(figures, 120 if LARGE else 30)


# --- 5. Per-item bulk failures ----------------------------------------------------------------


def test_bulk_item_failures_are_applied_or_dead_lettered_never_dropped(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
) -> None:
    from shared.ingest import pipeline

    n = 200 if LARGE else 50
    faults = BulkFaults({429: 0.15, 503: 0.1, 409: 0.1, 400: 0.05})
    proxy = BulkFaultProxy(get_settings().es_url(), faults)
    accepted: dict[str, int] = {}
    with paused(worker):  # this test's relay is the only one talking to Elasticsearch
        ups = [upload_text(client, auth, f"bulk-{i}.txt", _text(i, "bulk")) for i in range(n)]
        for up in ups:
            accepted[up["document_id"]] = up["version"]
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(up["job_id"]))
        proxied = Elasticsearch(proxy.url, request_timeout=30)

        def drained() -> bool:
            relay.drain(replace(connect(), index=ElasticsearchChunkIndex(proxied)), unit_of_work)
            with unit_of_work() as uow:
                return outbox_repo.outbox_backlog(uow.session, tenant) == 0

        started = time.monotonic()
        wait_for(drained, 120, interval=1, what="the outbox to drain through the fault proxy")
        drained_s = time.monotonic() - started
    proxy.close()
    with unit_of_work() as uow:
        pg = {cid for (cid,) in uow.session.execute(
            select(Chunk.id).where(Chunk.tenant_id == tenant))}  # fmt: skip
        letters = {
            d.ref: d.message
            for d in uow.session.scalars(
                select(DeadLetter).where(
                    DeadLetter.tenant_id == tenant, DeadLetter.source == "outbox"
                )
            )
        }
    with unit_of_work() as uow:
        own_docs = {str(d) for (d,) in uow.session.execute(
            select(Document.id).where(Document.tenant_id == tenant))}  # fmt: skip
    sent = {cid for cid in faults.sent if cid.split(":")[0] in own_docs}
    applied = faults.applied & sent
    print(
        f"\n[bulk-item-faults] items sent {len(sent)} (deliveries {sum(faults.sent.values())}), "
        f"applied {len(applied)}, dead-lettered {len(letters)}, injected "
        f"{dict(faults.injected)}"
    )
    assert sent == pg
    assert applied | set(letters) == sent  # nothing silently dropped
    assert set(letters) == faults.permanent_400 & sent  # only permanent errors are given up on
    assert all("injected by the fault proxy (400)" in m for m in letters.values())
    Figures(
        "bulk-item-faults",
        n,
        lost=len(sent - applied - set(letters)),
        duplicates=0,  # chunk ids are the Elasticsearch ids: one copy each by construction
        orphans=len(applied - pg),
        converged_s=drained_s,
        extra={
            "items_sent": len(sent),
            "applied": len(applied),
            "dead_lettered": len(letters),
            "injected": {str(k): v for k, v in faults.injected.items()},
        },
    ).report()


# --- 6. Replays: duplicate, reordered and stale writes ----------------------------------------


def test_replayed_and_stale_writes_end_at_the_newest_version(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    n = 100 if LARGE else 20
    rng = random.Random(5)
    accepted: dict[str, int] = {}
    _upload_many(client, auth, n, "replay", accepted)
    wait_converged(tenant, timeout=120)
    for i, doc_id in enumerate(list(accepted)):  # a second version of every document
        up = upload_text(client, auth, f"replay-{i}.txt", _text(i, "replay") + " (revised)")
        accepted[doc_id] = up["version"]
    wait_converged(tenant, timeout=120)
    deleted = list(accepted)[: n // 4]
    for doc_id in deleted:
        assert client.delete(f"/v1/documents/{doc_id}", headers=auth).status_code == 200
    wait_converged(tenant, timeout=120)

    es = get_es()
    index = tenant_index(tenant)
    es.indices.put_settings(index=index, settings={"index.gc_deletes": "1s"})
    try:
        time.sleep(2)  # Elasticsearch forgets the delete tombstones
        with unit_of_work() as uow:
            docs = uow.session.scalars(select(Document).where(Document.tenant_id == tenant)).all()
            writes = []
            for doc in docs:
                ids = [f"{doc.id}:{o}" for o in range(3)]
                for version in range(1, doc.version + 1):  # every version, stale ones included
                    writes += [(doc.id, version, ids)] * 3  # delivered three times
            rng.shuffle(writes)
            for document_id, version, ids in writes:
                outbox_repo.add_outbox(
                    uow.session,
                    tenant_id=tenant,
                    document_id=document_id,
                    op=OutboxOp.INDEX,
                    version=version,
                    chunk_ids=ids,
                )
        replayed = time.monotonic()
        figures = measure(
            "replays", tenant, accepted, replayed, timeout=120, writes_replayed=len(writes)
        )
    finally:
        es.indices.put_settings(index=index, settings={"index.gc_deletes": "60s"})
    resurrected = [
        d for d in deleted if client.get(f"/v1/documents/{d}", headers=auth).status_code != 404
    ]
    hits = es.search(
        index=index,
        query={"terms": {"document_id": deleted}},
        size=0,
        track_total_hits=True,
    )["hits"]["total"]["value"]
    figures.extra["resurrected_deletes"] = len(resurrected) + hits
    assert not resurrected and hits == 0
    assert_clean(figures, 120)


# --- 8. Load -------------------------------------------------------------------------------


@pytest.mark.usefixtures("worker")
def test_mixed_load_has_no_errors(live_api: str, tenant: str) -> None:
    duration_s, threads = (120, 8) if LARGE else (30, 4)
    headers = key_headers(tenant, ["read", "write"])
    with httpx.Client(base_url=live_api, headers=headers, timeout=30) as http:
        for i in range(20):  # something to find
            http.post("/v1/documents", json={"external_id": f"seed-{i}", "text": _text(i, "load")})
    latencies: dict[str, list[float]] = {"search": [], "upload": []}
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    def user(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=live_api, headers=headers, timeout=30) as http:
            while time.monotonic() < deadline:
                kind = "upload" if rng.random() < 0.1 else "search"
                started = time.perf_counter()
                if kind == "upload":
                    k = rng.randrange(10**9)
                    response = http.post(
                        "/v1/documents", json={"external_id": f"load-{k}", "text": _text(k, "load")}
                    )
                else:
                    response = http.post(
                        "/v1/search", json={"query": f"record {rng.randrange(20)}"}
                    )
                elapsed = (time.perf_counter() - started) * 1e3
                with lock:
                    statuses[response.status_code] += 1
                    latencies[kind].append(elapsed)

    workers = [threading.Thread(target=user, args=(s,)) for s in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    total = sum(statuses.values())
    errors = sum(n for s, n in statuses.items() if s >= 400)
    for kind, values in latencies.items():
        values.sort()
        if values:
            print(
                f"\n[load] {kind}: {len(values)} requests, p50 {statistics.median(values):.1f} ms, "
                f"p95 {values[int(0.95 * (len(values) - 1))]:.1f} ms"
            )
    print(
        f"[load] {total} requests in {duration_s} s = {total / duration_s:.1f} req/s with "
        f"{threads} clients; statuses {dict(statuses)}"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (ARTIFACTS / "figures.jsonl").open("a") as out:
        out.write(
            json.dumps(
                {
                    "scenario": "load",
                    "size": "large" if LARGE else "ci",
                    "requests": total,
                    "throughput_rps": round(total / duration_s, 1),
                    "statuses": dict(statuses),
                    "p50_ms": {
                        k: round(statistics.median(v), 1) for k, v in latencies.items() if v
                    },
                    "p95_ms": {
                        k: round(v[int(0.95 * (len(v) - 1))], 1) for k, v in latencies.items() if v
                    },
                }
            )
            + "\n"
        )
    assert not [s for s in statuses if s >= 500], statuses
    assert errors / total < 0.001, statuses


# --- 7. Link faults between Concord and its stores -------------------------------------------


class ApiProcess:
    """The API in its own process (uvicorn), configured by environment like a deployment."""

    def __init__(self, log: Path, env: dict[str, str]) -> None:
        import subprocess

        from services.cli.stack import api_command
        from tests.faults import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                api_command("127.0.0.1", self.port),
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 120, interval=0.5, what="the API process to start")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


class Supervisor:
    """Starts the worker again whenever it exits, and kills it first when it hangs on its way
    out, as a deployment's supervisor with a stop timeout and a liveness probe does. Under
    link faults Celery can give up: kombu fails while closing a channel whose connection was
    cut (AttributeError on the lost connection's info), and a soft time limit firing while a
    pool child reports an error has garbled the result pipe (UnicodeDecodeError). Celery
    treats both as unrecoverable and starts a warm shutdown, which can then wait for ever on
    a pool child."""

    GRACE_S = 10.0

    def __init__(self, worker: CeleryProcess) -> None:
        self.worker, self.restarts, self.killed = worker, 0, 0
        self._log_offset, self._since_banner = 0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        self._seen: float | None = None
        while not self._stop.wait(1.0):
            proc = self.worker.proc
            if proc is None:
                continue
            if proc.poll() is None:
                if self._seen is None and "Unrecoverable error" in self._tail():
                    self._seen = time.monotonic()
                if self._seen is not None and time.monotonic() - self._seen > self.GRACE_S:
                    self.worker.kill(signal.SIGKILL)
                    self.killed += 1
                continue
            self._seen = None
            self.worker.start()
            self.restarts += 1

    def _tail(self) -> str:
        """What the worker logged since its latest start's banner (the log is appended to
        across restarts); each call reads only the bytes written since the last one."""
        if not self.worker.log.exists():
            return self._since_banner
        with self.worker.log.open("rb") as log:
            log.seek(self._log_offset)
            new = log.read()
            self._log_offset = log.tell()
        self._since_banner += new.decode(errors="replace")
        banner = self._since_banner.rfind("[tasks]")
        if banner > 0:
            self._since_banner = self._since_banner[banner:]
        return self._since_banner

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# Each phase: (store, fault, options). What a request may wait is bounded by the timeout of
# the store it waits on: Elasticsearch's request timeout, Postgres's connect timeout, the
# Redis socket timeouts (rate limiter, publishing) - plus one second.
LINK_PHASES: list[tuple[str, str, dict[str, float]]] = [
    ("elasticsearch", "latency", {"latency_s": 0.2}),
    ("postgres", "reset", {"reset_after": 4096}),
    ("redis", "blackhole", {}),
    ("elasticsearch", "blackhole", {}),
    ("postgres", "blackhole", {}),
    ("redis", "reset", {"reset_after": 512}),
]


@pytest.fixture
def proxied_stack(tmp_path: Path, worker: CeleryProcess) -> Iterator[dict[str, Any]]:
    from tests.faults import TcpFaultProxy

    settings = get_settings()
    proxies = {
        "postgres": TcpFaultProxy(settings.pg_port),
        "redis": TcpFaultProxy(settings.redis_port),
        "elasticsearch": TcpFaultProxy(settings.es_port),
    }
    env = {
        "CONCORD_PG_PORT": str(proxies["postgres"].port),
        "CONCORD_REDIS_PORT": str(proxies["redis"].port),
        "CONCORD_ES_PORT": str(proxies["elasticsearch"].port),
    }
    proxied_worker = CeleryProcess("worker", tmp_path, env)
    proxied_worker.start()
    supervisor = Supervisor(proxied_worker)
    api = ApiProcess(tmp_path / "api.log", env)
    with paused(worker):  # only the proxied worker takes this scenario's work
        yield {"proxies": proxies, "api": api, "worker": proxied_worker, "supervisor": supervisor}
    supervisor.stop()
    api.stop()
    proxied_worker.stop()
    for proxy in proxies.values():
        proxy.close()


def test_link_faults_are_bounded_and_the_stack_recovers(
    tenant: str, proxied_stack: dict[str, Any]
) -> None:
    settings = get_settings()
    proxies, api = proxied_stack["proxies"], proxied_stack["api"]
    phase_s = 30 if LARGE else 12
    bound_s = max(settings.es_request_timeout_s, 5.0) + 1.0  # the slowest store timeout + 1 s
    headers = key_headers(tenant, ["read", "write"])
    http = httpx.Client(base_url=api.url, headers=headers, timeout=60)
    accepted: dict[str, int] = {}
    counter = iter(range(10**6))

    def one_round() -> list[tuple[str, int, float]]:
        timings = []
        i = next(counter)
        for kind in ("search", "upload"):
            started = time.monotonic()
            try:
                if kind == "upload":
                    body = {"external_id": f"link-{i}.txt", "text": _text(i, "link")}
                    response = http.post("/v1/documents", json=body)
                    if response.status_code == 202:
                        accepted[response.json()["document_id"]] = response.json()["version"]
                else:
                    response = http.post("/v1/search", json={"query": f"record {i % 7} link"})
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            timings.append((kind, status, time.monotonic() - started))
        return timings

    def p95_search(seconds: float) -> float:
        samples: list[float] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            http.post("/v1/search", json={"query": f"record {len(samples) % 7} link"})
            samples.append(time.monotonic() - started)
        samples.sort()
        return samples[int(0.95 * (len(samples) - 1))]

    for _ in range(10):
        one_round()
    baseline = p95_search(10)
    phases: dict[str, Any] = {}
    for store, fault, options in LINK_PHASES:
        proxies[store].set(fault, **options)
        deadline = time.monotonic() + phase_s
        results: list[tuple[str, int, float]] = []
        while time.monotonic() < deadline:
            results += one_round()
        proxies[store].set("pass")
        slowest = max(t for _, _, t in results)
        phases[f"{store}:{fault}"] = {
            "requests": len(results),
            "statuses": dict(Counter(s for _, s, _ in results)),
            "slowest_s": round(slowest, 2),
        }
        print(f"\n[link-faults] {store} {fault}: {phases[f'{store}:{fault}']}")
    healed = time.monotonic()

    recovered_after = None
    while time.monotonic() - healed < 30:
        if p95_search(3) <= baseline * 1.10 + 0.005:
            recovered_after = time.monotonic() - healed
            break
    figures = measure(
        "link-faults",
        tenant,
        accepted,
        healed,
        timeout=120,
        phases=phases,
        baseline_p95_ms=round(baseline * 1e3, 1),
        p95_recovered_after_s=None if recovered_after is None else round(recovered_after, 1),
        worker_restarts=proxied_stack["supervisor"].restarts,
        worker_killed_while_hanging=proxied_stack["supervisor"].killed,
    )
    http.close()
    for name, phase in phases.items():
        assert phase["slowest_s"] <= bound_s, (name, phase)
        assert all(s in (200, 202, 503) for s in phase["statuses"]), (name, phase)
    assert recovered_after is not None, figures
    assert (figures.lost, figures.duplicates, figures.orphans) == (0, 0, 0), figures


# --- Postgres unreachable for 10 s mid-ingest -------------------------------------------------


def test_a_postgres_outage_mid_ingest_loses_nothing_under_the_defaults(
    client: TestClient, auth: dict[str, str], tenant: str, proxied_stack: dict[str, Any]
) -> None:
    """The worker's link to Postgres refuses every connection (and drops the open ones) for
    10 s while it ingests, with the shipped lease, heartbeat, sweep and retry settings. Every
    job must be indexed, in both stores, within 60 s of Postgres' return."""
    from shared.settings import Settings

    shipped = Settings()
    assert (shipped.job_lease_seconds, shipped.sweep_interval_seconds) == (
        get_settings().job_lease_seconds,
        get_settings().sweep_interval_seconds,
    )
    n = 200 if LARGE else 80
    accepted: dict[str, int] = {}
    _upload_many(client, auth, n, "outage", accepted)

    def in_state(state: str) -> int:
        with unit_of_work() as uow:
            return count_rows(uow.session, IngestJob, tenant, IngestJob.state == state)

    def indexed() -> int:
        return in_state("indexed")

    # Mid-batch: a batch is claimed and being worked on when the link goes.
    wait_for(lambda: in_state("running") > 0, 120, interval=0.05, what="a batch under way")
    proxies = proxied_stack["proxies"]
    proxies["postgres"].set("refuse")
    time.sleep(10)
    indexed_during = indexed()
    proxies["postgres"].set("pass")
    returned = time.monotonic()
    wait_for(lambda: indexed() == n, 60, interval=0.5, what="every job indexed")
    all_indexed_s = time.monotonic() - returned
    figures = measure(
        "postgres-outage-10s",
        tenant,
        accepted,
        returned,
        timeout=60,
        indexed_before_return=indexed_during,
        all_jobs_indexed_after_s=round(all_indexed_s, 1),
        settings="shipped defaults (lease 20 s, heartbeat 5 s, sweep 5 s)",
    )
    with unit_of_work() as uow:
        letters = count_rows(uow.session, DeadLetter, tenant)
    assert letters == 0
    assert_clean(figures, within_s=60)
