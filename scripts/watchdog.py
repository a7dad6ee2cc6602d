"""Runs one of the suite's pytest runs with a wall-clock limit, and says where it hung.

    python scripts/watchdog.py --limit SECONDS --log FILE -- COMMAND...

COMMAND's output goes to FILE. Past the limit, every Python process under it (xdist
workers, Celery workers, whatever they started) has its threads' stacks printed by py-spy,
here and in FILE, with the end of FILE; then COMMAND is interrupted (pytest prints which tests
were running), terminated and killed, with everything it started, and this exits 124.

Why: each test has pytest-timeout's limit, but a process that hangs outside a test (at exit,
joining a thread) or in C code that never returns to Python is beyond it, and a CI run that
hit its own limit showed nothing but the phases that had ended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TAIL_LINES = 80


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after ``pid (comm)``, which may hold spaces and parentheses:
    [0] state, [1] parent pid, [19] start time. Empty once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (by parent pid, so also those in sessions of their own,
    as the suite's Celery workers are), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else []
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop(0)
        for child in sorted(children.get(pid, [])):
            found.append(child)
            pending.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def report_hang(root: int, log: Path, limit: float) -> str:
    lines = [f"======== still running after {limit:.0f} s: the stacks of its processes ========"]
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for pid in [root, *descendants(root)]:
        cmd = command_line(pid)
        lines.append(f"---- pid {pid}: {cmd[:200]}")
        if "python" not in cmd:
            continue
        try:
            dump = subprocess.run(
                [py_spy, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            lines.append((dump.stdout + dump.stderr).rstrip())
        except (OSError, subprocess.TimeoutExpired) as e:
            lines.append(f"(no stack: {e})")
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    lines.append(f"======== the last {len(tail)} lines of {log} ========")
    lines.extend(tail)
    return "\n".join(lines) + "\n"


def started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), to tell it from a later process that
    reuses its number; None once it is gone."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


def stop(process: subprocess.Popen[bytes]) -> None:
    """Interrupt first (pytest then reports the tests that were running and tears its
    fixtures down), then terminate and kill what is left of the tree, those in sessions of
    their own too (the suite's Celery workers, whose parent may be gone by then): each
    process found now or before the next signal, and only while it is that process."""
    found = {pid: started(pid) for pid in [process.pid, *descendants(process.pid)]}
    process.send_signal(signal.SIGINT)
    for sig, grace in ((None, 60), (signal.SIGTERM, 30), (signal.SIGKILL, 0)):
        if sig is not None:
            found.update({pid: started(pid) for pid in descendants(process.pid)})
            for pid, start in found.items():
                if start is not None and started(pid) == start:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=float, required=True, help="seconds")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    # Bash starts a background job with SIGINT ignored, and a child keeps an ignored signal
    # across exec: pytest would not see the interrupt that makes it report. A handler is
    # reset to the default in the child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with args.log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.limit
    while time.monotonic() < deadline:
        try:
            return process.wait(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            continue
    report = report_hang(process.pid, args.log, args.limit)
    sys.stdout.write(report)
    sys.stdout.flush()
    with args.log.open("a") as out:
        out.write(report)
    stop(process)
    return 124


if __name__ == "__main__":
    sys.exit(main())
