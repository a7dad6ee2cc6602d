"""CPU seconds used by each process of the local stack while a benchmark runs.

Wall-clock shares say where one worker spends its time; on two shared cores the question is
also what Postgres, Elasticsearch and the rest take from the encoder. The meter samples every
process of the stack (and their children: Celery's pool, Postgres backends) twice a second and
sums what each used since the meter started; a process that exits between two samples loses
at most that half second.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil

from services.cli.stack import services
from shared.settings import Settings


class StackCpuMeter:
    def __init__(self, settings: Settings, interval_s: float = 0.5) -> None:
        self._roots = {svc.name: svc.pid() for svc in services(settings, with_app=True)}
        self._interval_s = interval_s
        self._first: dict[tuple[int, float], float] = {}  # CPU seconds when first seen
        self._last: dict[tuple[int, float], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackCpuMeter:
        self._sample(started=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(started=False)

    def core_seconds(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for key, (name, cpu) in self._last.items():
            used[name] = used.get(name, 0.0) + cpu - self._first[key]
        return {name: round(seconds, 1) for name, seconds in sorted(used.items())}

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample(started=False)

    def _sample(self, started: bool) -> None:
        for name, pid in self._roots.items():
            if pid is None:
                continue
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    times = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
                except psutil.Error:
                    continue
                cpu = times.user + times.system
                # A process born after the meter started used nothing before it.
                self._first.setdefault(key, cpu if started else 0.0)
                self._last[key] = (name, cpu)
