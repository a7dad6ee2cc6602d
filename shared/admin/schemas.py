"""Response models of the operator's views: stats, reconcile reports and runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.schemas import Timestamp


class LastReconcile(BaseModel):
    at: Timestamp
    repair: bool
    duration_s: float
    total_drift: int | None


class Stats(BaseModel):
    """Counts for one tenant (the API) or all (the operator's CLI); queue depths are shared.
    A store that did not answer is reported as ``unavailable (<error>)``."""

    documents: int
    deleted_documents: int
    document_versions: int
    chunks_postgres: int
    outbox_backlog: int
    dead_letters: int
    jobs: dict[str, int] = Field(description="ingest jobs per state")
    last_reconcile: LastReconcile | None
    queue_depth: dict[str, int] | str
    chunks_elasticsearch: int | str


class ReconcileReportView(BaseModel):
    """What a reconcile found, per drift class (missing, stale, orphaned, wrong_tenant)."""

    tenants: int
    buckets_scanned: int
    buckets_differing: int
    ids_read: int
    counts: dict[str, int]
    samples: dict[str, list[str]]
    total_drift: int = Field(description="chunks whose stores disagree with no write under way")
    in_flight: int = Field(
        description="chunks whose stores differ while their outbox write is still waiting "
        "(an upload not yet relayed, or a repair queued earlier): not drift, not repaired again"
    )
    in_flight_samples: list[str]
    repairs_queued: int
    repairs_held_by_dead_letters: list[str]
    unrepairable: list[str]
    duration_s: float


class ReconcileResult(ReconcileReportView):
    mode: Literal["dry-run", "repair"]
    after_repair: ReconcileReportView | None = Field(
        default=None, description="the comparison after the repair (repair mode)"
    )


class ReconcileRunView(BaseModel):
    id: int
    tenant_id: str | None
    started_at: Timestamp
    duration_s: float
    repair: bool
    report: dict[str, Any]


class Replayed(BaseModel):
    replayed: str = Field(description="what was queued again")


class Discarded(BaseModel):
    discarded: bool
