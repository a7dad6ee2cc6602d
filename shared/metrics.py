"""Prometheus metrics.

Process-local metrics (search latency, degraded queries, stale hits) live in this process's
registry. System-wide figures (queue depth, outbox backlog, dead letters, jobs per state, ingest
stage durations) are read from Redis and Postgres at scrape time by ``SystemCollector``, so they
are right whichever process (API, any worker) did the work.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from shared.db import Transactions

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


class SystemCollector(Collector):
    """Reads the system-wide figures at scrape time, in a transaction from ``transactions``
    (the API's own unit of work: a scrape of /metrics is the boundary)."""

    def __init__(self, transactions: Transactions) -> None:
        self.transactions = transactions

    def collect(self) -> Iterator[GaugeMetricFamily | SummaryMetricFamily]:
        from shared.jobs import repository as jobs_repo
        from shared.outbox import repository as outbox_repo
        from shared.queue import queue_depths
        from shared.reconcile import repository as reconcile_repo

        try:
            depths = queue_depths()
            with self.transactions() as uow:
                backlog = outbox_repo.outbox_backlog(uow.session)
                dead = jobs_repo.dead_letter_count(uow.session)
                jobs = jobs_repo.job_state_counts(uow.session)
                stages = jobs_repo.stage_time_totals(uow.session)
                last = reconcile_repo.last_run(uow.session)
        except Exception as e:  # a scrape must not fail because a store is down
            log.warning("system metrics unavailable: %s: %s", type(e).__name__, e)
            return
        queue = GaugeMetricFamily("concord_queue_depth", "Messages waiting", labels=["queue"])
        for name, depth in depths.items():
            queue.add_metric([name], depth)
        yield queue
        yield GaugeMetricFamily(
            "concord_outbox_backlog", "Outbox rows not yet in ES", value=backlog
        )
        yield GaugeMetricFamily("concord_dead_letters", "Dead letters recorded", value=dead)
        job_family = GaugeMetricFamily("concord_jobs", "Ingest jobs by state", labels=["state"])
        for state, count in jobs.items():
            job_family.add_metric([state], count)
        yield job_family
        summary = SummaryMetricFamily(
            "concord_ingest_stage_seconds", "Time spent per ingest stage", labels=["stage"]
        )
        for stage, (count, total) in stages.items():
            summary.add_metric([stage], count_value=count, sum_value=total)
        yield summary
        if last is not None:
            drift = GaugeMetricFamily(
                "concord_drift", "Drift found by the last reconcile", labels=["class"]
            )
            for name, count in last.report.get("counts", {}).items():
                drift.add_metric([name], count)
            yield drift
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
