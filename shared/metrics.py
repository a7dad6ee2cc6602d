"""Prometheus metrics.

Process-local metrics (search latency, degraded queries, stale hits) live in this process's
registry. System-wide figures (queue depth, outbox backlog, dead letters, jobs per state, ingest
stage durations) are read from Redis and Postgres at scrape time by ``SystemCollector`` (at
most every few seconds), so they are right whichever process (API, any worker) did the work.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from shared.db import Transactions

if TYPE_CHECKING:
    from shared.queue import TaskQueue

log = logging.getLogger(__name__)

SEARCH_SECONDS = Histogram("concord_search_seconds", "Search latency", ["mode"])
SEARCH_STAGE_SECONDS = Histogram(
    "concord_search_stage_seconds",
    "Time per search stage (embed, dense, lexical, fuse, hydrate, rerank, mmr, policy)",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
API_REQUEST_SECONDS = Histogram(
    "concord_api_request_seconds",
    "API latency per route (the route template, not the raw path)",
    ["method", "route", "status"],
)
DEGRADED_QUERIES = Counter(
    "concord_degraded_queries_total", "Queries answered without one of the stores", ["reason"]
)
SEARCH_READS = Counter(
    "concord_search_reads_total",
    "Where searches read Postgres: replica, primary, or primary_fallback (the replica was "
    "behind by more than CONCORD_PG_READ_MAX_WAIT_MS, or unreachable)",
    ["source"],
)
LEXICAL_ANALYSIS_FALLBACKS = Counter(
    "concord_lexical_analysis_fallbacks_total",
    "Lexical searches of an index made under the other CONCORD_LEXICAL_ANALYSIS than the one "
    "set (searched under the one it indexes, until `concord reindex` builds it again)",
)
STALE_HITS_DROPPED = Counter(
    "concord_stale_hits_dropped_total",
    "Search hits dropped because Postgres does not hold them live (queued for repair)",
)


# /metrics answers without authentication, and its figures aggregate every job's history:
# however often it is scraped, a process reads them at most this often.
SYSTEM_FIGURES_MAX_AGE_S = 5.0


@dataclass(frozen=True)
class _SystemFigures:
    depths: dict[str, int]
    backlog: int
    dead: int
    jobs: dict[str, int]
    stages: dict[str, tuple[int, float]]
    last: Any  # the last reconcile run, or None
    # (content type, job state, jobs, parse seconds, jobs that recorded a parse)
    formats: list[tuple[str, str, int, float, int]]


class SystemCollector(Collector):
    """Reads the system-wide figures at scrape time (at most every
    :data:`SYSTEM_FIGURES_MAX_AGE_S`), in a transaction from ``transactions`` (the API's own
    unit of work: a scrape of /metrics is the boundary)."""

    def __init__(self, transactions: Transactions, queue: TaskQueue) -> None:
        self.transactions = transactions
        self.queue = queue
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._figures: _SystemFigures | None = None

    def _read(self) -> _SystemFigures | None:
        from shared.jobs import repository as jobs_repo
        from shared.outbox import repository as outbox_repo
        from shared.reconcile import repository as reconcile_repo

        try:
            depths = self.queue.queue_depths()
            with self.transactions() as uow:
                return _SystemFigures(
                    depths,
                    outbox_repo.outbox_backlog(uow.session),
                    jobs_repo.dead_letter_count(uow.session),
                    jobs_repo.job_state_counts(uow.session),
                    jobs_repo.stage_time_totals(uow.session),
                    reconcile_repo.last_run(uow.session),
                    jobs_repo.format_figures(uow.session),
                )
        except Exception as e:  # a scrape must not fail because a store is down
            log.warning("system metrics unavailable: %s: %s", type(e).__name__, e)
            return None

    def figures(self) -> _SystemFigures | None:
        with self._lock:  # concurrent scrapes share one read
            if time.monotonic() - self._read_at >= SYSTEM_FIGURES_MAX_AGE_S:
                self._figures, self._read_at = self._read(), time.monotonic()
            return self._figures

    def collect(self) -> Iterator[GaugeMetricFamily | SummaryMetricFamily]:
        figures = self.figures()
        if figures is None:
            return
        queue = GaugeMetricFamily("concord_queue_depth", "Messages waiting", labels=["queue"])
        for name, depth in figures.depths.items():
            queue.add_metric([name], depth)
        yield queue
        yield GaugeMetricFamily(
            "concord_outbox_backlog", "Outbox rows not yet in ES", value=figures.backlog
        )
        yield GaugeMetricFamily("concord_dead_letters", "Dead letters recorded", value=figures.dead)
        job_family = GaugeMetricFamily("concord_jobs", "Ingest jobs by state", labels=["state"])
        for state, count in figures.jobs.items():
            job_family.add_metric([state], count)
        yield job_family
        summary = SummaryMetricFamily(
            "concord_ingest_stage_seconds", "Time spent per ingest stage", labels=["stage"]
        )
        for stage, (count, total) in figures.stages.items():
            summary.add_metric([stage], count_value=count, sum_value=total)
        yield summary
        yield from _format_families(figures.formats)
        last = figures.last  # the last reconcile run
        if last is not None:
            drift = GaugeMetricFamily(
                "concord_drift", "Drift found by the last reconcile", labels=["class"]
            )
            for name, count in last.report.get("counts", {}).items():
                drift.add_metric([name], count)
            yield drift
            yield GaugeMetricFamily(
                "concord_reconcile_in_flight",
                "Chunks the last reconcile found with their write still in the outbox (not drift)",
                value=last.report.get("in_flight", 0),
            )
            yield GaugeMetricFamily(
                "concord_last_reconcile_timestamp_seconds",
                "When the last reconcile started",
                value=last.started_at.timestamp(),
            )
            yield GaugeMetricFamily(
                "concord_last_reconcile_duration_seconds",
                "How long the last reconcile took",
                value=last.duration_s,
            )
            yield GaugeMetricFamily(
                "concord_last_reconcile_repairs",
                "Repairs the last reconcile queued",
                value=last.report.get("repairs_queued", 0),
            )


def _format_families(
    rows: list[tuple[str, str, int, float, int]],
) -> Iterator[GaugeMetricFamily | SummaryMetricFamily]:
    """Ingest jobs per document format and state (``failed`` ones are the format's
    failures), and the time their parse took, per format."""
    from shared.parsing import SUPPORTED_TYPES

    jobs: dict[tuple[str, str], int] = {}
    parse: dict[str, tuple[int, float]] = {}
    for content_type, state, count, seconds, timed in rows:
        kind = SUPPORTED_TYPES.get(content_type, "other")
        jobs[kind, state] = jobs.get((kind, state), 0) + count
        before = parse.get(kind, (0, 0.0))
        parse[kind] = (before[0] + timed, before[1] + seconds)
    family = GaugeMetricFamily(
        "concord_jobs_by_format",
        "Ingest jobs by document format and state",
        labels=["format", "state"],
    )
    for (kind, state), count in sorted(jobs.items()):
        family.add_metric([kind, state], count)
    yield family
    parse_family = SummaryMetricFamily(
        "concord_parse_seconds", "Time spent parsing, per document format", labels=["format"]
    )
    for kind, (count, total) in sorted(parse.items()):
        parse_family.add_metric([kind], count_value=count, sum_value=total)
    yield parse_family
