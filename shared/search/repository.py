"""All SQL of the read path; every query is scoped to one tenant."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from shared.ingest import repository as ingest_repo
from shared.models import Chunk, Document, OutboxOp


def nearest_chunks(
    session: Session, tenant_id: str, vector: list[float], limit: int, ef_search: int
) -> Sequence[Any]:
    # Iterative scan keeps the HNSW walk going when the tenant filter discards candidates.
    session.execute(text(f"SET LOCAL hnsw.ef_search = {int(ef_search)}"))
    session.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
    distance = Chunk.embedding.cosine_distance(vector)
    return session.execute(
        select(Chunk.id, distance.label("distance"))
        .where(Chunk.tenant_id == tenant_id)
        .order_by(distance)
        .limit(limit)
    ).all()


def live_chunks(session: Session, tenant_id: str, ids: Sequence[str]) -> dict[str, Any]:
    """The chunks among ``ids`` that are live: their document exists, is not deleted, and
    the chunk is at the document's current version."""
    if not ids:
        return {}
    rows = session.execute(
        select(
            Chunk.id,
            Chunk.document_id,
            Chunk.version,
            Chunk.text,
            Chunk.section,
            Document.external_id,
            Document.title,
        )
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.id.in_(list(ids)),
            Chunk.tenant_id == tenant_id,
            Document.tenant_id == tenant_id,
            Document.deleted.is_(False),
            Chunk.version == Document.version,
        )
    ).all()
    return {row.id: row for row in rows}


def queue_repair(session: Session, tenant_id: str, stale_ids: Sequence[str]) -> None:
    """Queue an Elasticsearch delete for hits Postgres does not hold live. The delete carries
    the document's current version, so it can never block a later, newer write."""
    by_doc: dict[uuid.UUID, list[str]] = {}
    for cid in stale_ids:
        try:
            by_doc.setdefault(uuid.UUID(cid.split(":", 1)[0]), []).append(cid)
        except ValueError:
            continue
    docs = ingest_repo.documents_by_ids(session, list(by_doc))
    for doc_id, cids in by_doc.items():
        doc = docs.get(doc_id)
        if doc is None or doc.tenant_id != tenant_id:
            continue
        live = ingest_repo.chunks_by_ids(session, cids)
        orphans = [c for c in cids if c not in live or doc.deleted]
        ingest_repo.add_outbox(
            session,
            tenant_id=tenant_id,
            document_id=doc_id,
            op=OutboxOp.DELETE,
            version=doc.version,
            chunk_ids=orphans,
        )
