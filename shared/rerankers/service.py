"""The registry of trained rerankers: per tenant, by name (``concord reranker train`` writes
it; ``rerank.model`` in a search request or profile reads it). Every lookup is scoped to the
caller's tenant, so one tenant can never select another's model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from shared.db.repository import now
from shared.models import TrainedReranker
from shared.rerankers.schemas import RerankerView
from shared.tenants import repository as tenants_repo
from shared.tenants import service as tenants


def register(
    session: Session, tenant_id: str, name: str, path: Path, base_model: str, card: dict[str, Any]
) -> TrainedReranker:
    """Point ``name`` at a newly trained model; the previous one's files are removed after
    commit by :func:`remove_files` (a search already holding it finishes with it)."""
    entry = tenants.named_for_writing(session, TrainedReranker, tenant_id, name)
    entry.path = str(path)
    entry.base_model = base_model
    entry.card = card
    entry.created_at = now(session)
    session.flush()
    return entry


def get(session: Session, tenant_id: str, name: str) -> TrainedReranker:
    return tenants.named(session, TrainedReranker, tenant_id, name, "trained reranker")


def list_for_tenant(session: Session, tenant_id: str) -> list[TrainedReranker]:
    return tenants_repo.named_rows(session, TrainedReranker, tenant_id)


def delete(session: Session, tenant_id: str, name: str) -> str:
    """Unregister; returns the model's directory for the caller to remove after commit."""
    entry = get(session, tenant_id, name)
    tenants_repo.delete_named_row(session, entry)
    return entry.path


def remove_files(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def reranker_view(entry: TrainedReranker) -> RerankerView:
    return RerankerView(
        name=entry.name, base_model=entry.base_model, created_at=entry.created_at, card=entry.card
    )
