"""All SQL of the search's own table: each tenant's calibration of the default decision.
Functions take a session and never commit."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.models import TenantCalibration


def calibration(session: Session, tenant_id: str) -> TenantCalibration | None:
    return session.get(TenantCalibration, tenant_id)


def calibrations(session: Session) -> dict[str, TenantCalibration]:
    return {c.tenant_id: c for c in session.scalars(select(TenantCalibration))}


def save_calibration(session: Session, row: TenantCalibration) -> None:
    """Insert or replace the tenant's calibration (computed again: now)."""
    values = {
        "tenant_id": row.tenant_id,
        "min_score": row.min_score,
        "chunks": row.chunks,
        "corpus_low": row.corpus_low,
        "background_high": row.background_high,
        "samples": row.samples,
    }
    statement = insert(TenantCalibration).values(**values)
    updates = {k: v for k, v in values.items() if k != "tenant_id"}
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[TenantCalibration.tenant_id],
            set_={**updates, "computed_at": statement.excluded.computed_at},
        )
    )
