"""The Postgres side of tenants and API keys (all of their SQL)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, true
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.models import ApiKey, Tenant


def ensure_tenant(session: Session, tenant_id: str) -> None:
    ensure_tenants(session, [tenant_id])


def ensure_tenants(session: Session, tenant_ids: Sequence[str]) -> None:
    rows = [{"id": t, "name": t} for t in sorted(set(tenant_ids))]
    if rows:
        session.execute(insert(Tenant).values(rows).on_conflict_do_nothing())


def key_by_hash(session: Session, key_hash: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash))


def keys_of(session: Session, tenant_id: str | None) -> Sequence[ApiKey]:
    """One tenant's keys, or every key when ``tenant_id`` is None, oldest first."""
    return session.scalars(
        select(ApiKey)
        .where(ApiKey.tenant_id == tenant_id if tenant_id is not None else true())
        .order_by(ApiKey.created_at)
    ).all()
