"""What every service of the local stack shares: names, errors, PID files, ports, waits."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

SERVICE_USER = "concord"
# The infrastructure's services, by name: also "postgres-replica" and "elasticsearch-2", ...
INFRA = ("postgres", "redis", "elasticsearch")


def is_infra(name: str) -> bool:
    return name.split("-")[0] in INFRA


# The CPU-bound work (embedding, reranker training) and the I/O-bound rest.
INGEST_QUEUES = ("ingest", "training")
RELAY_QUEUES = ("relay", "maintenance")
# Requests to receivers that tenants chose (they may hang): a worker of their own.
WEBHOOK_QUEUES = ("webhooks",)


class StackError(RuntimeError):
    """A prerequisite is missing or a service did not come up; the message says what to do."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    up: bool
    pid: int | None
    where: str
    restarts: int | None = None  # by the supervisor; None for services it does not watch


# ---------------------------------------------------------------- helpers


def _is_root() -> bool:
    return os.geteuid() == 0


def _ensure_service_user() -> None:
    if not _is_root():
        return
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
        )


def _owned_dir(path: Path) -> Path:
    """A directory the service user can write (everything under the state dir, when root)."""
    path.mkdir(parents=True, exist_ok=True)
    if _is_root():
        shutil.chown(path, SERVICE_USER, SERVICE_USER)
    return path


def _as_service_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--", *cmd] if _is_root() else cmd


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(FileNotFoundError):
        if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not bind ``port``: a listener, but also an open connection
    whose local end uses it (ports in the kernel's ephemeral range are handed to outgoing
    connections). SO_REUSEADDR as the servers set it, so TIME_WAIT leftovers do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def _wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    logs: Sequence[Path],
    still_running: Callable[[], bool] = lambda: True,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if not still_running():
            timeout_s = 0
            break
        time.sleep(0.5)
    why = f"within {timeout_s:.0f}s" if timeout_s else "(its process exited)"
    raise StackError(f"{what} did not become healthy {why}{_log_tails(logs)}")


def _log_tails(logs: Sequence[Path], lines: int = 25) -> str:
    tails = ""
    for log in logs:
        if log.exists():
            last = log.read_text(errors="replace").splitlines()[-lines:]
            tails += f"\n--- last lines of {log} ---\n" + "\n".join(last)
    return tails


def _refuse_taken_port(name: str, port: int) -> None:
    if _port_in_use(port):
        raise StackError(
            f"port {port} for {name} is already taken by another process; stop it or choose "
            f"another port (CONCORD_{name.upper()}_PORT)"
        )


def _stop_pid(pid: int | None, timeout_s: float = 30.0, group: bool = False) -> None:
    if not _pid_alive(pid):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM) if group else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
