"""All SQL of tenants, their API keys and their named rows (search profiles, trained rerankers:
looked up by the caller's tenant and a name, so no tenant can read or select another's).
Functions take a session and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TypeVar

from sqlalchemy import func, select, true
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.models import ApiKey, SearchProfile, Tenant, TrainedAnswerability, TrainedReranker

Named = TypeVar("Named", SearchProfile, TrainedReranker, TrainedAnswerability)


def ensure_tenant(session: Session, tenant_id: str) -> None:
    ensure_tenants(session, [tenant_id])


def ensure_tenants(session: Session, tenant_ids: Sequence[str]) -> None:
    rows = [{"id": t, "name": t} for t in sorted(set(tenant_ids))]
    if rows:
        session.execute(insert(Tenant).values(rows).on_conflict_do_nothing())


def tenant_exists(session: Session, tenant_id: str) -> bool:
    return session.get(Tenant, tenant_id) is not None


def add_key(session: Session, key: ApiKey) -> None:
    session.add(key)
    session.flush()


def key_by_id(session: Session, key_id: uuid.UUID) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def key_by_hash(session: Session, key_hash: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash))


def live_key_count(session: Session, tenant_id: str) -> int:
    """The tenant's keys not revoked."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(ApiKey)
            .where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
        )
        or 0
    )


def keys_of(session: Session, tenant_id: str | None) -> Sequence[ApiKey]:
    """One tenant's keys, or every key when ``tenant_id`` is None, oldest first."""
    return session.scalars(
        select(ApiKey)
        .where(ApiKey.tenant_id == tenant_id if tenant_id is not None else true())
        .order_by(ApiKey.created_at)
    ).all()


def named_row(session: Session, model: type[Named], tenant_id: str, name: str) -> Named | None:
    return session.get(model, (tenant_id, name))


def named_row_or_new(session: Session, model: type[Named], tenant_id: str, name: str) -> Named:
    """The tenant's row called ``name``, added (its other fields left to the caller) if new."""
    row = named_row(session, model, tenant_id, name)
    if row is None:
        row = model(tenant_id=tenant_id, name=name)
        session.add(row)
    return row


def named_rows(session: Session, model: type[Named], tenant_id: str) -> list[Named]:
    """A tenant's search profiles or trained rerankers, by name."""
    return list(
        session.scalars(select(model).where(model.tenant_id == tenant_id).order_by(model.name))
    )


def delete_named_row(
    session: Session, row: SearchProfile | TrainedReranker | TrainedAnswerability
) -> None:
    session.delete(row)
    session.flush()
