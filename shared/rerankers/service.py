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
from shared.tenants.named import NamedRegistry

RERANKERS = NamedRegistry(TrainedReranker, "trained reranker")


def register(
    session: Session, tenant_id: str, name: str, path: Path, base_model: str, card: dict[str, Any]
) -> TrainedReranker:
    """Point ``name`` at a newly trained model; the previous one's files are removed after
    commit by :func:`remove_files` (a search already holding it finishes with it)."""
    entry = RERANKERS.for_writing(session, tenant_id, name)
    entry.path = str(path)
    entry.base_model = base_model
    entry.card = card
    entry.created_at = now(session)
    session.flush()
    return entry


get, find, list_for_tenant = RERANKERS.get, RERANKERS.find, RERANKERS.list


def delete(session: Session, tenant_id: str, name: str) -> str:
    """Unregister; returns the model's directory for the caller to remove after commit."""
    return RERANKERS.delete(session, tenant_id, name).path


def remove_files(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def reranker_view(entry: TrainedReranker) -> RerankerView:
    return RerankerView(
        name=entry.name, base_model=entry.base_model, created_at=entry.created_at, card=entry.card
    )
