"""All SQL on the ``chunks`` table (pgvector lives in it): what PgVectorStore
(shared/stores/vector_store.py) runs. Functions take a session and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    String,
    Table,
    any_,
    case,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, defer

from shared.db import any_of
from shared.models import Chunk, Document
from shared.reconcile.buckets import bucket_of, fingerprint
from shared.stores.schemas import BucketStats, Fingerprints, VersionChunks
from shared.vector_type import vector_bytes, vector_from_bytes

# ------------------------------------------------------------------ writes


def upsert_chunks(session: Session, versions: Sequence[VersionChunks]) -> None:
    """Write the chunks of many document versions in one statement; an older version can
    never overwrite a newer one. At most one entry per document (Postgres refuses to update
    one row twice in a statement)."""
    values = [
        {
            "id": r.id,
            "tenant_id": v.tenant_id,
            "document_id": v.document_id,
            "version": v.version,
            "ordinal": r.ordinal,
            "text": r.text,
            "text_hash": r.text_hash,
            "char_start": r.char_start,
            "char_end": r.char_end,
            "section": r.section,
            "title": v.title,
            "token_count": r.token_count,
            "flags": r.flags,
            "bucket": bucket_of(r.id),
            "fingerprint": fingerprint(
                chunk_id=r.id,
                tenant_id=v.tenant_id,
                document_id=str(v.document_id),
                external_id=v.external_id,
                version=v.version,
                ordinal=r.ordinal,
                text_hash=r.text_hash,
                title=v.title,
                section=r.section,
                metadata=v.metadata,
            ),
            "embedding": r.embedding,
            "metadata": v.metadata,
        }
        for v in versions
        for r in v.rows
    ]
    if not values:
        return
    chunks = cast(Table, Chunk.__table__)
    statement = insert(chunks)
    excluded = statement.excluded
    # Executed with a list of rows: one cached statement whatever the count, which
    # SQLAlchemy sends as multi-row VALUES batches.
    session.connection().execute(
        statement.on_conflict_do_update(
            index_elements=[chunks.c.id],
            set_={
                "version": excluded.version,
                "ordinal": excluded.ordinal,
                "text": excluded.text,
                "text_hash": excluded.text_hash,
                "char_start": excluded.char_start,
                "char_end": excluded.char_end,
                "section": excluded.section,
                "title": excluded.title,
                "token_count": excluded.token_count,
                "flags": excluded.flags,
                "fingerprint": excluded.fingerprint,
                "embedding": excluded.embedding,
                "metadata": excluded.metadata,
                "updated_at": func.now(),
            },
            where=chunks.c.version <= excluded.version,
        ),
        values,
    )


def delete_superseded_chunks(
    session: Session, versions: dict[uuid.UUID, int], counts: dict[uuid.UUID, int] | None = None
) -> dict[uuid.UUID, list[str]]:
    """Remove the chunks older than each document's given version (superseded by it, or
    deleted by its tombstone) and, where ``counts`` gives how many chunks that version now
    has, its own chunks past that count (a version chunked again into fewer chunks), in one
    statement: document id -> the ids it removed."""
    if not versions:
        return {}
    counts = counts or {}
    result = session.execute(
        text(
            "DELETE FROM chunks c "
            "USING unnest(CAST(:documents AS uuid[]), CAST(:versions AS integer[]), "
            "CAST(:counts AS integer[])) AS live(document_id, version, chunks) "
            "WHERE c.document_id = live.document_id AND (c.version < live.version "
            "OR (c.version = live.version AND c.ordinal >= live.chunks)) "
            "RETURNING c.document_id, c.id"
        ),
        {
            "documents": list(versions),
            "versions": list(versions.values()),
            "counts": [counts.get(d) for d in versions],
        },
    )
    removed: dict[uuid.UUID, list[str]] = {}
    for document_id, chunk_id in result:
        removed.setdefault(document_id, []).append(chunk_id)
    return removed


# ------------------------------------------------------------------ reads by id


def chunks_by_ids(session: Session, ids: Sequence[str]) -> dict[str, Chunk]:
    """The chunks that exist, by id, without their embeddings (which none of the callers
    needs and which cost the most to read)."""
    if not ids:
        return {}
    query = (
        select(Chunk).where(any_of(Chunk.id, ids)).options(defer(Chunk.embedding, raiseload=True))
    )
    return {c.id: c for c in session.scalars(query)}


def chunk_tenants(session: Session, ids: Sequence[str]) -> dict[str, str]:
    if not ids:
        return {}
    rows = session.execute(select(Chunk.id, Chunk.tenant_id).where(any_of(Chunk.id, ids)))
    return {cid: tenant for cid, tenant in rows}


def document_chunks(
    session: Session, tenant_id: str, document_id: uuid.UUID, section: str | None
) -> Sequence[Chunk]:
    """Every chunk of the document's live version, in order (an exact lookup, not a top-k)."""
    query = (
        select(Chunk)
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.document_id == document_id,
            Chunk.tenant_id == tenant_id,
            Document.tenant_id == tenant_id,
            Document.deleted.is_(False),
            Chunk.version == Document.version,
        )
        .order_by(Chunk.ordinal)
    )
    if section is not None:
        query = query.where(Chunk.section == section)
    return session.scalars(query).all()


def count_chunks(session: Session, *conditions: ColumnElement[bool]) -> int:
    return session.scalar(select(func.count()).select_from(Chunk).where(*conditions)) or 0


# ------------------------------------------------------------------ search and hydration


def nearest_chunks(
    session: Session,
    tenant_id: str,
    vector: list[float],
    limit: int,
    ef_search: int,
    conditions: Sequence[ColumnElement[bool]] = (),
    exact: bool = False,
) -> Sequence[Any]:
    """Cosine top-``limit`` among the tenant's chunks that satisfy ``conditions``.

    ``exact``: scan the tenant's own rows (through the tenant index) and sort them all. For a
    small tenant this is both exact and faster than the shared HNSW graph, whose walk also
    visits every other tenant's vectors (identical texts in two tenants make it much worse).

    Otherwise HNSW: with filters, an HNSW walk can run out of candidates before it finds
    ``limit`` matches; the iterative scan keeps walking until it does (up to
    hnsw.max_scan_tuples). Relaxed order is cheaper, so the result is re-sorted exactly."""
    distance = Chunk.embedding.cosine_distance(vector).label("distance")
    if exact:
        # Plain index scans off: the HNSW index cannot serve the ORDER BY; the tenant index
        # still finds the rows (as a bitmap scan).
        session.execute(text("SELECT set_config('enable_indexscan', 'off', true)"))
        return session.execute(
            select(Chunk.id, distance)
            .where(Chunk.tenant_id == tenant_id, *conditions)
            .order_by(distance)
            .limit(limit)
        ).all()
    session.execute(
        text(
            "SELECT set_config('hnsw.ef_search', :ef, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true)"
        ),
        {"ef": str(int(ef_search))},
    )
    relaxed = (
        select(Chunk.id, distance)
        .where(Chunk.tenant_id == tenant_id, *conditions)
        .order_by(distance)
        .limit(limit)
        .cte("relaxed_results")
        .prefix_with("MATERIALIZED")
    )
    return session.execute(
        select(relaxed.c.id, relaxed.c.distance).order_by(relaxed.c.distance)
    ).all()


def live_chunks(
    session: Session,
    tenant_id: str,
    ids: Sequence[str],
    vector: list[float] | None,
    embeddings_for: Sequence[str] = (),
) -> dict[str, Any]:
    """The chunks among ``ids`` that are live (document exists, not deleted, chunk at the
    document's version), with provenance and cosine similarity to ``vector``. Embeddings
    (``embedding``, else None) only for ``embeddings_for``: the few likely results, which need
    them, pay for transferring and decoding 384 floats each; the rest never do."""
    if not ids:
        return {}
    columns: list[Any] = [
        Chunk.id,
        Chunk.document_id,
        Chunk.version,
        Chunk.text,
        Chunk.section,
        Chunk.char_start,
        Chunk.char_end,
        Chunk.token_count,
        Chunk.flags,
        Chunk.updated_at,
        Document.external_id,
        Document.title,
    ]
    if vector is not None:
        columns.append((1 - Chunk.embedding.cosine_distance(vector)).label("cosine"))
    # NULL except for ``embeddings_for`` (an empty list matches no id).
    columns.append(
        case((_id_among(embeddings_for), vector_bytes(Chunk.embedding))).label("embedding")
    )
    rows = session.execute(
        select(*columns)
        .join(Document, Document.id == Chunk.document_id)
        .where(
            _id_among(ids),
            Chunk.tenant_id == tenant_id,
            Document.tenant_id == tenant_id,
            Document.deleted.is_(False),
            Chunk.version == Document.version,
        )
    ).all()
    return {row.id: row for row in rows}


def chunk_embeddings(session: Session, tenant_id: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
    if not ids:
        return {}
    rows = session.execute(
        select(Chunk.id, vector_bytes(Chunk.embedding)).where(
            _id_among(ids), Chunk.tenant_id == tenant_id
        )
    ).all()
    return {cid: vector_from_bytes(raw) for cid, raw in rows}


def metadata_values(
    session: Session, tenant_id: str, ids: Sequence[str], key: str
) -> dict[str, Any]:
    """Chunk id -> the value of metadata ``key`` (JSON: a number, string, ...), for the chunks
    among ``ids`` that have one."""
    if not ids:
        return {}
    rows = session.execute(
        select(Chunk.id, Chunk.metadata_[key]).where(
            _id_among(ids), Chunk.tenant_id == tenant_id, Chunk.metadata_.has_key(key)
        )
    ).all()
    return {cid: value for cid, value in rows}


def _id_among(ids: Sequence[str]) -> ColumnElement[bool]:
    """``id = ANY(array)``: one parameter, where ``IN`` sends (and SQLAlchemy expands) one per
    id; for the 200 ids of a 100-result search the query took 5.6 ms instead of 3.4."""
    return Chunk.id == any_(literal(list(ids), ARRAY(String)))


# ------------------------------------------------------------------ reconciliation


def tenants(session: Session) -> set[str]:
    return set(session.scalars(select(Chunk.tenant_id).distinct()))


def bucket_stats(session: Session, tenant_id: str) -> BucketStats:
    """bucket -> (chunks, sum of versions, sum of fingerprints). Chunks in Postgres are
    always live: superseded and tombstoned ones are deleted in the writing transaction."""
    rows = session.execute(
        select(Chunk.bucket, func.count(), func.sum(Chunk.version), func.sum(Chunk.fingerprint))
        .where(Chunk.tenant_id == tenant_id)
        .group_by(Chunk.bucket)
    )
    return {int(b): (int(n), int(v), int(h)) for b, n, v, h in rows}


def fingerprints(session: Session, tenant_id: str, condition: ColumnElement[bool]) -> Fingerprints:
    """chunk id -> (version, fingerprint) of the tenant's chunks that match ``condition``."""
    rows = session.execute(
        select(Chunk.id, Chunk.version, Chunk.fingerprint).where(
            Chunk.tenant_id == tenant_id, condition
        )
    )
    return {cid: (version, fp) for cid, version, fp in rows}


# ------------------------------------------------------------------ reindex


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
