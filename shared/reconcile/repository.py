"""The Postgres side of reconciliation (all of its SQL)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import ColumnElement, Integer, cast, func, select
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.models import Chunk, DeadLetter, Document, EsOutbox


def pg_tenants(session: Session) -> set[str]:
    return set(session.scalars(select(Chunk.tenant_id).distinct()))


def bucket_stats(session: Session, tenant_id: str) -> dict[int, tuple[int, int, int]]:
    """bucket -> (chunks, sum of versions, sum of fingerprints). Chunks in Postgres are
    always live: superseded and tombstoned ones are deleted in the writing transaction."""
    rows = session.execute(
        select(Chunk.bucket, func.count(), func.sum(Chunk.version), func.sum(Chunk.fingerprint))
        .where(Chunk.tenant_id == tenant_id)
        .group_by(Chunk.bucket)
    )
    return {int(b): (int(n), int(v), int(h)) for b, n, v, h in rows}


def chunks_in_buckets(
    session: Session, tenant_id: str, buckets: Sequence[int]
) -> dict[str, tuple[int, int]]:
    return _fingerprints(session, tenant_id, any_of(Chunk.bucket, buckets)) if buckets else {}


def chunks_by_ids(
    session: Session, tenant_id: str, ids: Sequence[str]
) -> dict[str, tuple[int, int]]:
    return _fingerprints(session, tenant_id, any_of(Chunk.id, ids)) if ids else {}


def _fingerprints(
    session: Session, tenant_id: str, condition: ColumnElement[bool]
) -> dict[str, tuple[int, int]]:
    """chunk id -> (version, fingerprint) of the tenant's chunks that match ``condition``."""
    rows = session.execute(
        select(Chunk.id, Chunk.version, Chunk.fingerprint).where(
            Chunk.tenant_id == tenant_id, condition
        )
    )
    return {cid: (version, fp) for cid, version, fp in rows}


def chunks_with_queued_writes(session: Session, ids: Sequence[str]) -> set[str]:
    """The chunks among ``ids`` that already have an outbox row waiting (a repair queued by an
    earlier reconcile, or an ingest write not yet relayed): queuing another would only repeat
    it."""
    if not ids:
        return set()
    return set(session.scalars(select(EsOutbox.chunk_id).where(any_of(EsOutbox.chunk_id, ids))))


def dead_lettered_versions(session: Session, ids: Sequence[str]) -> dict[str, int]:
    """chunk id -> the newest version among its Elasticsearch writes that are dead letters not
    yet replayed or discarded."""
    if not ids:
        return {}
    version = cast(DeadLetter.payload["version"].astext, Integer)
    rows = session.execute(
        select(DeadLetter.ref, func.max(version))
        .where(DeadLetter.source == "outbox", any_of(DeadLetter.ref, ids))
        .group_by(DeadLetter.ref)
    )
    return {ref: int(v) for ref, v in rows if v is not None}


def chunk_tenants(session: Session, ids: Sequence[str]) -> dict[str, str]:
    if not ids:
        return {}
    rows = session.execute(select(Chunk.id, Chunk.tenant_id).where(any_of(Chunk.id, ids)))
    return {cid: tenant for cid, tenant in rows}


def document_id_of(chunk_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(chunk_id.split(":", 1)[0])
    except ValueError:
        return uuid.UUID(int=0)


def document_versions_for_chunks(
    session: Session, ids: Sequence[str]
) -> dict[str, tuple[uuid.UUID, int]]:
    """chunk id -> (document id, the document's current version), for documents we know."""
    doc_ids = {document_id_of(cid) for cid in ids}
    rows = session.execute(
        select(Document.id, Document.version).where(any_of(Document.id, doc_ids))
    )
    versions = {doc_id: version for doc_id, version in rows}
    return {
        cid: (document_id_of(cid), versions[document_id_of(cid)])
        for cid in ids
        if document_id_of(cid) in versions
    }


def chunk_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Chunk)) or 0


def chunk_count_up_to(session: Session, last_id: str) -> int:
    return session.scalar(select(func.count()).select_from(Chunk).where(Chunk.id <= last_id)) or 0


def chunks_after(session: Session, last_id: str, limit: int) -> list[tuple[Chunk, Document]]:
    """The next page of chunks in id order (keyset pagination), with their documents."""
    rows = session.execute(
        select(Chunk, Document)
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.id > last_id)
        .order_by(Chunk.id)
        .limit(limit)
    )
    return [(chunk, doc) for chunk, doc in rows]
