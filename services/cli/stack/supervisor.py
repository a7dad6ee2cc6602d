"""The local stack's supervisor: keeps the API, the workers and beat running, as compose's
``restart: unless-stopped`` does for the container stack.

``concord stack up`` starts it detached; it starts each project process (or adopts one a
previous supervisor left running), checks every ``CHECK_INTERVAL_S`` that each is alive, and
restarts one that died, after a backoff that doubles while a process keeps dying within
``STABLE_AFTER_S`` of its start (a crash loop must not spin). Restart counts and the time of
each process's last restart go to ``app/supervisor.json``, which ``concord stack status``
shows. SIGTERM (``concord stack down``) stops the processes, then the supervisor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.cli.stack.common import _pid_alive
from services.cli.stack.processes import ProjectProcess, app_processes
from shared.settings import get_settings

log = logging.getLogger("concord.supervisor")

CHECK_INTERVAL_S = 0.5
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0


@dataclass
class Watched:
    restarts: int = 0
    last_restart: float | None = None  # wall clock, for operators
    started: float = 0.0  # monotonic
    quick_deaths: int = 0  # deaths in a row within STABLE_AFTER_S of a start
    due: float = 0.0  # monotonic: when a dead process may be started again


def state_file(settings: Any) -> Path:
    return Path(settings.state_path()) / "app" / "supervisor.json"


def read_state(settings: Any) -> dict[str, dict[str, Any]]:
    """name -> {"restarts": n, "last_restart": epoch seconds or None} ({} if never run)."""
    try:
        return dict(json.loads(state_file(settings).read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def run() -> None:
    settings = get_settings()
    processes = app_processes(settings)
    watched = {p.name: Watched() for p in processes}  # counts since this supervisor started
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for proc in processes:
        if not _pid_alive(proc.pid()):
            proc.spawn()
        watched[proc.name].started = time.monotonic()
    _save(settings, watched)
    while not stopping:
        _reap_children()
        for proc in processes:
            if not stopping and not _pid_alive(proc.pid()):
                _restart(proc, watched[proc.name], settings, watched)
        time.sleep(CHECK_INTERVAL_S)
    for proc in reversed(processes):
        proc.down()
    state_file(settings).unlink(missing_ok=True)


def _restart(
    proc: ProjectProcess, state: Watched, settings: Any, watched: dict[str, Watched]
) -> None:
    now = time.monotonic()
    if state.due == 0.0:  # just found dead: schedule the restart
        # At once after a stable run; 1, 2, 4 ... 30 s while it keeps dying young.
        quick = now - state.started < STABLE_AFTER_S
        state.quick_deaths = state.quick_deaths + 1 if quick else 0
        delay = (
            min(FIRST_BACKOFF_S * 2 ** (state.quick_deaths - 1), MAX_BACKOFF_S) if quick else 0.0
        )
        state.due = now + delay
        log.warning("%s (pid %s) exited; restart in %.0fs", proc.name, proc.pid(), state.due - now)
        # Whatever it forked (Celery's pool) goes with it: its group is its pid.
        pid = proc.pid()
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    if now < state.due:
        return
    proc.spawn()
    state.restarts += 1
    state.last_restart = time.time()
    state.started = time.monotonic()
    state.due = 0.0
    log.warning("%s restarted (pid %s, restart %d)", proc.name, proc.pid(), state.restarts)
    _save(settings, watched)


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _save(settings: Any, watched: dict[str, Watched]) -> None:
    body = {
        name: {"restarts": w.restarts, "last_restart": w.last_restart}
        for name, w in watched.items()
    }
    path = state_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # readers never see half a file


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run()
