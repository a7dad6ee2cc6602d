"""Test fixtures against the real stack (Postgres/pgvector, Elasticsearch, Redis, Celery).

The infrastructure is brought up by `scripts/test.sh` (`concord stack up --infra-only`). Tests
get their own Postgres database, Elasticsearch index prefix and Redis database, and every test
works in a fresh tenant, so nothing here touches the development data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Under pytest-xdist each worker (gw0, gw1, ...) gets a database, an index prefix and a Redis
# database of its own (and so Celery queues of its own), on the same servers.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_NUMBER = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else -1
# A run beside others (scripts/test.sh names each: "system_a"...) keeps its names apart
# too, whichever servers it is pointed at.
_RUN = os.environ.get("CONCORD_TEST_RUN", "")
_SUFFIX = "".join(f"_{part}" for part in (_RUN, XDIST_WORKER) if part)

TEST_ENV = {
    "CONCORD_ENVIRONMENT": "test",
    "CONCORD_PG_DATABASE": f"concord_test{_SUFFIX}",
    # "main" for a run without xdist: its reset deletes "<prefix>-*", which for a bare
    # "concord-test" was every parallel worker's indices too (a unit test run beside the
    # suite on the same servers emptied them mid-run).
    "CONCORD_ES_INDEX_PREFIX": f"concord-test{(_SUFFIX or '_main').replace('_', '-')}",
    "CONCORD_REDIS_DB": str(2 + _WORKER_NUMBER),  # 1 without xdist; 0 is the dev stack's
    "CONCORD_TASK_SOFT_TIME_LIMIT_S": "15",
    "CONCORD_TASK_TIME_LIMIT_S": "18",
    "CONCORD_RELAY_INTERVAL_SECONDS": "1",
    # Tests inject drift on purpose; a periodic repair must not race them.
    "CONCORD_RECONCILE_INTERVAL_SECONDS": "0",
    "CONCORD_MAX_UPLOAD_BYTES": str(256 * 1024),
    # Tests fire requests faster than any client should; the rate-limit test lowers it.
    "CONCORD_RATE_LIMIT_PER_SECOND": "1000",
    "CONCORD_RATE_LIMIT_BURST": "1000",
    "CONCORD_RATE_LIMIT_TENANT_PER_SECOND": "1000",
    "CONCORD_RATE_LIMIT_TENANT_BURST": "1000",
    # The suite's clients share one address and send wrong keys on purpose; the admission
    # test lowers these.
    "CONCORD_AUTH_FAILURES_PER_SECOND": "1000",
    "CONCORD_AUTH_FAILURES_BURST": "1000",
    # The suite's webhook receivers listen on this machine; 127.0.0.2 and the rest of the
    # loopback network stay refused, for the egress tests.
    "CONCORD_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
}
os.environ.update(TEST_ENV)

from fastapi.testclient import TestClient  # noqa: E402

from services.cli.stack import (  # noqa: E402
    INGEST_QUEUES,
    RELAY_QUEUES,
    WEBHOOK_QUEUES,
    celery_worker_command,
)
from shared.settings import get_settings  # noqa: E402

# Each contract test class that names the ports it holds (PORTS) must call all their methods.
from tests.contract.port_calls import port_calls  # noqa: E402, F401

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"


def admin_connection() -> Any:
    """An autocommit connection to the suite's Postgres server, outside any database of ours
    (to create and drop databases)."""
    from services.cli.stack import PostgresService

    return PostgresService(get_settings()).connect("postgres")


def _recreate_database() -> None:
    s = get_settings()
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{s.pg_database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{s.pg_database}"')


def _reset_elasticsearch() -> None:
    from shared.stores.elastic import get_es
    from shared.stores.es_index import ensure_index

    es = get_es()
    pattern = f"{get_settings().es_index_prefix}-*"
    # Who reset which server's indices, for a run that finds its indices gone.
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / "es-resets.log").open("a") as log:
        log.write(f"{time.time():.3f} pid {os.getpid()} run {_RUN or '-'} worker "
                  f"{XDIST_WORKER or '-'} port {get_settings().es_port} {pattern}\n")  # fmt: skip
    es.indices.delete(index=pattern, allow_no_indices=True, expand_wildcards="all")
    ensure_index(get_settings())


def _purge_redis() -> None:
    import redis

    s = get_settings()
    redis.Redis(host=s.redis_host, port=s.redis_port, db=s.redis_db).flushdb()


@pytest.fixture(scope="session")
def fresh_stores() -> None:
    from shared.migrate import upgrade_head

    _recreate_database()
    upgrade_head(get_settings())
    _reset_elasticsearch()
    _purge_redis()


@pytest.fixture(autouse=True)
def _stores_for_tiers_that_use_them(request: pytest.FixtureRequest) -> None:
    """Every tier but the unit tier works on the real stores, made fresh once per session;
    the unit tier needs no service running (its store-backed tests use the in-memory stores
    of shared/stores/memory/, and a unit test that asks for ``fresh_stores`` gets them)."""
    if _tier(request.node.nodeid) != "unit":
        request.getfixturevalue("fresh_stores")


@pytest.fixture
def content_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CONCORD_INGEST_CONTENT_ROOT for upload events by reference, holding acme's
    notes/tide.txt (each tenant's files in a directory of its own)."""
    root = tmp_path / "shared-content"
    (root / "acme" / "notes").mkdir(parents=True)
    (root / "acme" / "notes" / "tide.txt").write_bytes(b"Tides follow the moon.")
    monkeypatch.setattr(get_settings(), "ingest_content_root", str(root))
    return root


class CeleryProcess:
    """A real Celery worker (or beat) in its own process group, killable by the tests."""

    def __init__(
        self, kind: str, log_dir: Path, env: dict[str, str] | None = None, node: str | None = None
    ) -> None:
        self.kind = kind
        self.node = node or f"test-{uuid.uuid4().hex[:6]}@%h"  # a worker's Celery node name
        self.log = log_dir / f"{kind}.log"
        self.env = {**os.environ, **(env or {})}  # e.g. a shorter visibility timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        base = [sys.executable, "-m", "celery", "-A", "workers.celery_app:celery_app"]
        if self.kind == "worker":  # one process takes every queue but the webhooks'
            return celery_worker_command(INGEST_QUEUES + RELAY_QUEUES, 1, self.node)
        if self.kind == "webhooks":  # as in the stack: receivers never hold up the rest
            return celery_worker_command(WEBHOOK_QUEUES, 1, self.node)
        return [*base, "beat", "--loglevel=INFO", "-s", str(self.log.parent / "beat-schedule")]

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )

    def child_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return [int(p) for p in out.split()]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def celery_processes(
    tmp_path_factory: pytest.TempPathFactory, fresh_stores: None
) -> Iterator[dict[str, CeleryProcess]]:
    log_dir = tmp_path_factory.mktemp("celery")
    procs = {kind: CeleryProcess(kind, log_dir) for kind in ("worker", "webhooks", "beat")}
    for proc in procs.values():
        proc.start()
    yield procs
    for proc in procs.values():
        proc.stop()


@pytest.fixture(scope="session")
def worker(celery_processes: dict[str, CeleryProcess]) -> CeleryProcess:
    return celery_processes["worker"]


@pytest.fixture(scope="session")
def webhook_worker(celery_processes: dict[str, CeleryProcess]) -> CeleryProcess:
    """The worker of the webhooks queue (a process of its own, as in the stack)."""
    return celery_processes["webhooks"]


@pytest.fixture(scope="session")
def client() -> Iterator[TestClient]:
    from services.api.app import create_app
    from services.api.warm_up import WarmUp

    warming = WarmUp()
    with TestClient(create_app(warming)) as c:
        assert warming.wait(300), "the API's warm-up did not finish in 300 s"
        yield c


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def api_key(tenant: str) -> str:
    from tests.helpers import new_key

    return new_key(tenant, ["read", "write"])


@pytest.fixture
def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.3,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        # None and False mean "not yet"; any other value (even an empty dict) is the answer.
        if value is not None and value is not False:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def es_service() -> Iterator[Any]:
    """The real Elasticsearch of this stack, to stop and start; always left running."""
    from services.cli.stack import ElasticsearchService

    service = ElasticsearchService(get_settings())
    yield service
    service.up()


@pytest.fixture
def redis_service() -> Iterator[Any]:
    from services.cli.stack import RedisService

    service = RedisService(get_settings())
    yield service
    service.up()


@pytest.fixture(scope="module")
def live_api() -> Iterator[str]:
    """The API app served by uvicorn on a free port, in this process, for clients that need
    real HTTP (a browser, schemathesis)."""
    import socket
    import threading

    import uvicorn

    from services.api.app import create_app
    from services.api.warm_up import WarmUp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warming = WarmUp()
    server = uvicorn.Server(
        uvicorn.Config(create_app(warming), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started and warming.wait(0), 300, what="uvicorn to start and warm up")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier is the test's first folder under tests/; tests/system is marked ``system``
    (scripts/test.sh runs it apart, on infrastructure of its own)."""
    for item in items:
        if _tier(item.nodeid) == "system":
            item.add_marker(pytest.mark.system)


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "tests"


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Seconds spent per tier (setup, call and teardown of its tests, summed over workers)."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            duration = getattr(report, "duration", None)
            if not nodeid or duration is None:
                continue
            tier = _tier(nodeid)
            seconds[tier] = seconds.get(tier, 0.0) + duration
            if getattr(report, "when", "") == "call":
                counts[tier] = counts.get(tier, 0) + 1
    if not seconds:
        return
    terminalreporter.write_sep("=", "tier timings")
    for tier in sorted(seconds, key=lambda t: -seconds[t]):
        terminalreporter.write_line(
            f"{tier:<14} {counts.get(tier, 0):4d} tests {seconds[tier]:8.1f} s of test time"
        )


@pytest.fixture(autouse=True)
def _cpu_profile(request: pytest.FixtureRequest) -> Iterator[None]:
    """With CONCORD_TEST_CPU_PROFILE=<file>: the machine's busy CPU seconds during each test
    (setup to teardown, every process: the suite's own, the workers, the stores), appended
    to <file> as JSON lines. A serial run's profile shows where the suite's time goes."""
    out = os.environ.get("CONCORD_TEST_CPU_PROFILE")
    if not out:
        yield
        return
    import json

    import psutil

    def busy() -> float:
        t = psutil.cpu_times()
        return float(t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0))

    started, cpu = time.monotonic(), busy()
    yield
    with open(out, "a") as f:
        f.write(json.dumps({"test": request.node.nodeid, "wall_s": time.monotonic() - started,
                            "cpu_s": busy() - cpu}) + "\n")  # fmt: skip
