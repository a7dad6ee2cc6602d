"""Per-tenant named rows (search profiles, trained rerankers): every lookup is scoped to the
caller's tenant, so one tenant can never read or select another's by name."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from shared.errors import NotFound
from shared.models import SearchProfile, TrainedReranker
from shared.search import repository as repo

Named = TypeVar("Named", SearchProfile, TrainedReranker)


def get_named(session: Session, model: type[Named], tenant_id: str, name: str, kind: str) -> Named:
    """The tenant's row called ``name``, or 404 "no <kind> '<name>'"."""
    row = session.get(model, (tenant_id, name))
    if row is None:
        raise NotFound(f"no {kind} {name!r}")
    return row


def get_or_add_named(session: Session, model: type[Named], tenant_id: str, name: str) -> Named:
    """The tenant's row called ``name``, created (unsaved fields for the caller) if new."""
    row = session.get(model, (tenant_id, name))
    if row is None:
        row = model(tenant_id=tenant_id, name=name)
        session.add(row)
    return row


def list_named(session: Session, model: type[Named], tenant_id: str) -> list[Named]:
    return list(repo.named_rows(session, model, tenant_id))
