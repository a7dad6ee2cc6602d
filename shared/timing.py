"""Time per named stage, summed over every entry into it (ingest jobs record seconds, search
responses milliseconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


class StageTimes:
    def __init__(
        self, totals: dict[str, float] | None = None, scale: float = 1.0, digits: int = 4
    ) -> None:
        """``totals``: the dict to add to (kept by the caller); ``scale``: 1 for seconds, 1e3
        for milliseconds; ``digits``: rounding of each total."""
        self.totals: dict[str, float] = {} if totals is None else totals
        self.scale, self.digits = scale, digits

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = (time.perf_counter() - started) * self.scale
            self.totals[name] = round(self.totals.get(name, 0.0) + spent, self.digits)

    def timed(self, name: str, fn: Callable[[], T]) -> T:
        with self.stage(name):
            return fn()
