"""All SQL of reconciliation's own table: the record of every run and what it found. (The
chunks it compares are read through the stores, shared/stores/.) Functions take a session and
never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.models import ReconcileRun


def add_run(
    session: Session,
    *,
    tenant_id: str | None,
    duration_s: float,
    repair: bool,
    report: dict[str, Any],
) -> None:
    session.add(
        ReconcileRun(tenant_id=tenant_id, duration_s=duration_s, repair=repair, report=report)
    )


def recent_runs(session: Session, *, tenant_id: str | None, limit: int) -> Sequence[ReconcileRun]:
    """Newest first, of one tenant or (None) every run."""
    query = select(ReconcileRun).order_by(ReconcileRun.id.desc()).limit(limit)
    if tenant_id:
        query = query.where(ReconcileRun.tenant_id == tenant_id)
    return session.scalars(query).all()


def last_run(session: Session, tenant_id: str | None = None) -> ReconcileRun | None:
    runs = recent_runs(session, tenant_id=tenant_id, limit=1)
    return runs[0] if runs else None
