"""The Postgres side of evaluation and tuning (all of its SQL)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.models import Chunk, Document


def live_documents(session: Session, tenant_id: str) -> dict[str, tuple[uuid.UUID, str]]:
    """external id -> (document id, content hash) of the tenant's live documents."""
    rows = session.execute(
        select(Document.id, Document.external_id, Document.content_hash).where(
            Document.tenant_id == tenant_id, Document.deleted.is_(False)
        )
    )
    return {external_id: (doc_id, digest) for doc_id, external_id, digest in rows}


def chunk_embeddings(session: Session, tenant_id: str) -> list[tuple[str, str, Any]]:
    """(chunk id, document external id, embedding) of every chunk of the tenant."""
    rows = session.execute(
        select(Chunk.id, Document.external_id, Chunk.embedding)
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.tenant_id == tenant_id)
    )
    return [(cid, external_id, embedding) for cid, external_id, embedding in rows]
