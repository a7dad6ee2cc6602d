"""The project's own processes (API, workers, beat) and the supervisor that keeps them up."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

import httpx

from services.cli.stack.common import (
    INGEST_QUEUES,
    RELAY_QUEUES,
    WEBHOOK_QUEUES,
    StackError,
    _pid_alive,
    _read_pid,
    _refuse_taken_port,
    _stop_pid,
    _wait_until,
)
from shared.settings import Settings

# ---------------------------------------------------------------- API, worker, beat


class ProjectProcess:
    """A process of this project (API, worker, beat), run in its own session so that ``down``
    can stop it and the children it forked (Celery's pool) by its process group."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        argv: list[str],
        where: str,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.s = settings
        self.name = name
        self.argv = argv
        self._where = where
        self.stop_timeout_s = stop_timeout_s
        self.dir = settings.state_path() / "app"
        self.pidfile = self.dir / f"{name}.pid"
        self.log = self.dir / f"{name}.log"

    def pid(self) -> int | None:
        return _read_pid(self.pidfile)

    def where(self) -> str:
        return self._where

    def healthy(self) -> bool:
        if self.name == "api":
            try:
                return httpx.get(f"{self.s.api_url()}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        return _pid_alive(self.pid())

    def _warmed_up(self) -> bool:
        """The API's start-up warm-up has run (/readyz says so whatever the stores say)."""
        try:
            body = httpx.get(f"{self.s.api_url()}/readyz", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(body.get("checks", {}).get("warm_up", {}).get("ok"))

    def up(self) -> None:
        """Start the process unless it runs, and wait until it is healthy."""
        if _pid_alive(self.pid()):
            return
        if self.name == "api":
            _refuse_taken_port(self.name, self.s.api_port)
        pid = self.spawn()
        self.wait_healthy()
        if self.name != "api":
            time.sleep(1.0)
            if not _pid_alive(pid):
                raise StackError(f"{self.name} exited at start; see {self.log}")

    def spawn(self) -> int:
        """Start the process (no checks, no waiting) and record its pid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pidfile.write_text(str(proc.pid))
        return proc.pid

    def wait_healthy(self, timeout_s: float = 90) -> None:
        _wait_until(self.healthy, timeout_s, self.name, [self.log])
        if self.name == "api":  # up: its warm-up done too, so no first request pays for it
            _wait_until(self._warmed_up, 180, "the api's warm-up", [self.log])

    def down(self) -> None:
        _stop_pid(self.pid(), timeout_s=self.stop_timeout_s, group=True)
        self.pidfile.unlink(missing_ok=True)


def api_command(host: str, port: int, *options: str) -> list[str]:
    """The API server's command line (the stack, the query benchmark and the reliability
    tests all start it this way)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "services.api.app:create_app",
        "--factory",
        "--host",
        host,
        "--port",
        str(port),
        *options,
    ]


def app_processes(settings: Settings) -> list[ProjectProcess]:
    py = sys.executable
    beat_schedule = settings.state_path() / "app" / "celerybeat-schedule"
    return [
        ProjectProcess(
            settings,
            "api",
            api_command(settings.api_host, settings.api_port),
            settings.api_url(),
        ),
        # Two workers, so that the relay's bulk requests and the sweeps never hold up an
        # encoder: on two cores a relay between two batches cost each encoding process
        # 0.1-0.5 s of every 2.5 s batch, mostly waiting on Elasticsearch and Postgres.
        ProjectProcess(
            settings,
            "worker",
            celery_worker_command(INGEST_QUEUES, settings.worker_concurrency, "concord-ingest@%h"),
            f"queues {', '.join(INGEST_QUEUES)}",
        ),
        ProjectProcess(
            settings,
            "relay-worker",
            celery_worker_command(
                RELAY_QUEUES, settings.relay_worker_concurrency, "concord-relay@%h"
            ),
            f"queues {', '.join(RELAY_QUEUES)}",
        ),
        # One process: its run sends up to webhook_concurrency requests at once, asynchronously.
        ProjectProcess(
            settings,
            "webhook-worker",
            celery_worker_command(WEBHOOK_QUEUES, 1, "concord-webhooks@%h"),
            f"queues {', '.join(WEBHOOK_QUEUES)}",
        ),
        ProjectProcess(
            settings,
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "workers.celery_app:celery_app",
                "beat",
                "--loglevel=INFO",
                "-s",
                str(beat_schedule),
            ],
            "periodic sweep, relay, reconcile",
        ),
    ]


def supervisor_process(settings: Settings) -> ProjectProcess:
    """Starts the app processes and restarts any that dies (services/cli/stack/supervisor.py).
    Stopping it stops them first, so it gets their stop time too."""
    return ProjectProcess(
        settings,
        "supervisor",
        [sys.executable, "-m", "services.cli.stack.supervisor"],
        "restarts api, workers and beat",
        stop_timeout_s=150.0,
    )


def celery_worker_command(queues: Sequence[str], concurrency: int, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app:celery_app",
        "worker",
        "--loglevel=INFO",
        f"--concurrency={concurrency}",
        "-Q",
        ",".join(queues),
        "-n",
        name,
    ]
