"""CPU seconds used by each process of the local stack while a benchmark runs.

Wall-clock shares say where one worker spends its time; on two shared cores the question is
also what Postgres, Elasticsearch and the rest take from the encoder. The meter reads each
service's process tree twice, when the run starts and when it ends, and nothing in between:
what a process has used is its own CPU time plus that of its children that have exited
(the kernel adds a child's time to its parent's when the parent reaps it), so the tree's
total at the end, less its total at the start, is what it used in between, processes that
came and went included. (An earlier version sampled every tree twice a second; that cost
the benchmark itself about 0.5 CPU-seconds per 15 s on the cores it measures.)
"""

from __future__ import annotations

from types import TracebackType

import psutil

from services.cli.stack import services
from shared.settings import Settings


class StackCpuMeter:
    def __init__(self, settings: Settings) -> None:
        self._roots = {svc.name: svc.pid() for svc in services(settings, with_app=True)}
        self._started: dict[str, float] = {}
        self._ended: dict[str, float] = {}

    def __enter__(self) -> StackCpuMeter:
        self._started = self._totals()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ended = self._totals()

    def core_seconds(self) -> dict[str, float]:
        used = {
            name: total - self._started[name]
            for name, total in self._ended.items()
            if name in self._started
        }
        return {name: round(seconds, 1) for name, seconds in sorted(used.items())}

    def _totals(self) -> dict[str, float]:
        """Each service's CPU seconds so far: its live processes' own, plus those of the
        children they have reaped. A process belongs to the innermost service whose tree
        holds it (the supervisor's tree holds the workers', beat's and the API's)."""
        trees: dict[str, list[psutil.Process]] = {}
        for name, pid in self._roots.items():
            if pid is None:
                continue
            try:
                root = psutil.Process(pid)
                trees[name] = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        owner: dict[int, str] = {}
        for name, procs in sorted(trees.items(), key=lambda item: -len(item[1])):
            owner.update((proc.pid, name) for proc in procs)  # smaller trees overwrite
        totals = dict.fromkeys(trees, 0.0)
        for name, procs in trees.items():
            for proc in procs:
                if owner[proc.pid] != name:
                    continue
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue  # exited since listed: its time is in its parent's once reaped
                totals[name] += (
                    times.user + times.system + times.children_user + times.children_system
                )
        return totals
