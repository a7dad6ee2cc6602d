"""`concord stack up | status | down` on its own state directory and ports, and the compose
file's validity."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from services.cli.stack import _pid_alive, _read_pid

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_root() -> Iterator[Path]:
    """Under the repository: pytest's own tmp dirs are private to root, and the service user
    that runs Postgres and Elasticsearch must reach the state directory."""
    path = ROOT / ".concord" / "test-stacks" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def concord(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


def test_stack_up_twice_status_and_down_leave_nothing_behind(state_root: Path):
    state = state_root / "state"
    env = {
        **os.environ,
        "CONCORD_STATE_DIR": str(state),
        "CONCORD_PG_PORT": "15532",
        "CONCORD_REDIS_PORT": "16479",
        "CONCORD_ES_PORT": "19300",
        "CONCORD_API_PORT": "18100",
        "CONCORD_PG_DATABASE": "concord",
        "CONCORD_ES_INDEX_PREFIX": "concord",
        "CONCORD_REDIS_DB": "0",
    }
    try:
        first = concord(["stack", "up", "--infra-only"], env)
        assert first.returncode == 0, first.stdout + first.stderr
        for name in ("postgres", "redis", "elasticsearch"):
            assert f"up {name}" in " ".join(first.stdout.split())

        again = concord(["stack", "up", "--infra-only"], env)
        assert again.returncode == 0, again.stdout + again.stderr

        status = concord(["stack", "status"], env)
        assert status.returncode == 0, status.stdout
        assert status.stdout.count(" up ") >= 3

        pids = [
            _read_pid(state / "postgres" / "data" / "postmaster.pid"),
            _read_pid(state / "redis" / "redis.pid"),
            _read_pid(state / "elasticsearch" / "es.pid"),
        ]
        assert all(_pid_alive(pid) for pid in pids)
    finally:
        down = concord(["stack", "down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(_pid_alive(pid) for pid in pids)
    after = concord(["stack", "status"], env)
    assert after.returncode == 1 and " up " not in after.stdout


def test_a_taken_port_is_reported_clearly(state_root: Path):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        env = {
            **os.environ,
            "CONCORD_STATE_DIR": str(state_root / "s"),
            "CONCORD_REDIS_PORT": str(port),
            "CONCORD_PG_PORT": "15533",
        }
        result = concord(["stack", "up", "--infra-only"], env)
        concord(["stack", "down"], env)
    assert result.returncode == 1
    assert f"port {port} for redis is already taken" in " ".join(result.stdout.split())


def _compose_command() -> list[str] | None:
    if (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_file_is_valid():
    command = _compose_command()
    if command is None:
        pytest.skip("no docker compose client on this machine")
    result = subprocess.run(
        [*command, "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for service in ("postgres", "redis", "elasticsearch", "api", "worker", "relay-worker", "beat"):
        assert f"{service}:" in result.stdout


def test_the_scaled_out_compose_layout_merges_over_the_single_node_one():
    command = _compose_command()
    if command is None:
        pytest.skip("no docker compose client on this machine")
    files = ("docker-compose.yml", "docker-compose.scale.yml")
    result = subprocess.run(
        [*command, *(a for f in files for a in ("-f", str(ROOT / f))), "config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]
    assert {"postgres-replica", "es02", "es03"} <= set(merged)
    assert merged["elasticsearch"]["environment"]["discovery.type"] == "multi-node"
    for service in ("api", "worker", "relay-worker", "beat", "migrate"):
        env = merged[service]["environment"]
        # The single-node settings are still there; the scaled ones are added to them.
        assert env["CONCORD_PG_HOST"] == "postgres"
        assert env["CONCORD_ES_URLS"].count("http://") == 3
        assert env["CONCORD_ES_REPLICAS"] == "1"
        assert env["CONCORD_PG_READ_URL"].endswith("@postgres-replica:5432/concord")


def test_the_supervisor_restarts_a_killed_worker_and_beat_and_counts_it(state_root: Path):
    """``concord stack up`` runs the app under a supervisor: a worker main process or beat
    killed with SIGKILL is running again within seconds, ``stack status`` shows the restart,
    and ``stack down`` still stops everything, the restarted processes included."""
    import signal
    import time

    state = state_root / "state"
    env = {
        **os.environ,
        "CONCORD_STATE_DIR": str(state),
        "CONCORD_PG_PORT": "15534",
        "CONCORD_REDIS_PORT": "16480",
        "CONCORD_ES_PORT": "19301",
        "CONCORD_API_PORT": "18101",
        "CONCORD_PG_DATABASE": "concord",
        "CONCORD_ES_INDEX_PREFIX": "concord",
        "CONCORD_REDIS_DB": "0",
    }
    app = state / "app"
    names = ("api", "worker", "relay-worker", "beat", "supervisor")
    seen: set[int] = set()
    try:
        up = concord(["stack", "up"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        before = {name: _read_pid(app / f"{name}.pid") for name in names}
        assert all(_pid_alive(pid) for pid in before.values()), before
        seen |= {pid for pid in before.values() if pid}

        worker_pid, beat_pid = before["worker"], before["beat"]
        assert worker_pid and beat_pid
        os.killpg(worker_pid, signal.SIGKILL)  # the main process and its pool
        os.kill(beat_pid, signal.SIGKILL)
        killed = time.monotonic()
        restarted: dict[str, int | None] = {}
        while time.monotonic() - killed < 60:
            restarted = {n: _read_pid(app / f"{n}.pid") for n in ("worker", "beat")}
            if all(pid and pid != before[n] and _pid_alive(pid) for n, pid in restarted.items()):
                break
            time.sleep(0.5)
        seen |= {pid for pid in restarted.values() if pid}
        assert all(pid != before[n] and _pid_alive(pid) for n, pid in restarted.items())
        assert time.monotonic() - killed < 10  # the first restart waits no backoff

        status = concord(["stack", "status"], env)
        rows = {line.split()[1]: line.split() for line in status.stdout.splitlines() if "│" in line}
        assert rows["worker"][7] == "1" and rows["beat"][7] == "1", status.stdout
        assert rows["api"][7] == "0" and rows["relay-worker"][7] == "0", status.stdout
        assert _read_pid(app / "api.pid") == before["api"]  # the others were left alone
    finally:
        down = concord(["stack", "down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(_pid_alive(pid) for pid in seen)
