"""Prometheus metrics shared by the API and the workers."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

STAGE_SECONDS = Histogram(
    "concord_ingest_stage_seconds",
    "Time per ingest stage",
    ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
SEARCH_SECONDS = Histogram("concord_search_seconds", "Search latency", ["mode"])
DEGRADED_QUERIES = Counter(
    "concord_degraded_queries_total", "Queries answered degraded", ["reason"]
)
STALE_HITS_DROPPED = Counter(
    "concord_stale_hits_dropped_total",
    "Search hits dropped because Postgres does not hold them live",
)
