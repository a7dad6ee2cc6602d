"""The Postgres side of the operator's views (all of their SQL)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from shared.models import DeadLetter, IngestJob, JobState, ReconcileRun


def recent_jobs(
    session: Session, *, state: str | None, stuck: bool, tenant_id: str | None, limit: int
) -> Sequence[IngestJob]:
    """Newest first; ``stuck``: queued or running past their lease."""
    query = select(IngestJob).order_by(IngestJob.created_at.desc()).limit(limit)
    if state:
        query = query.where(IngestJob.state == state)
    if stuck:
        query = query.where(
            IngestJob.state.in_([JobState.QUEUED, JobState.RUNNING]),
            IngestJob.lease_expires_at < func.now(),
        )
    if tenant_id:
        query = query.where(IngestJob.tenant_id == tenant_id)
    return session.scalars(query).all()


def recent_reconcile_runs(
    session: Session, *, tenant_id: str | None, limit: int
) -> Sequence[ReconcileRun]:
    query = select(ReconcileRun).order_by(ReconcileRun.id.desc()).limit(limit)
    if tenant_id:
        query = query.where(ReconcileRun.tenant_id == tenant_id)
    return session.scalars(query).all()


def recent_dead_letters(
    session: Session, *, tenant_id: str | None, limit: int
) -> Sequence[DeadLetter]:
    query = select(DeadLetter).order_by(DeadLetter.id.desc()).limit(limit)
    if tenant_id:
        query = query.where(DeadLetter.tenant_id == tenant_id)
    return session.scalars(query).all()


def delete_dead_letter(session: Session, letter_id: int) -> None:
    session.execute(delete(DeadLetter).where(DeadLetter.id == letter_id))
