"""All SQL on the ``chunks`` table (pgvector lives in it): what PgVectorStore
(shared/stores/vector_store.py) runs. Functions take a session and never commit."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Select,
    String,
    Table,
    and_,
    any_,
    bindparam,
    case,
    exists,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, aliased, defer

from shared.db import any_of
from shared.db.repository import run_unlock, try_run_lock
from shared.models import Chunk, Document, Tenant
from shared.stores.buckets import bucket_of, fingerprint
from shared.stores.schemas import BucketStats, ChunkRow, Fingerprints, VersionChunks
from shared.vector_type import vector_bytes, vector_from_bytes

# ------------------------------------------------------------------ writes


def upsert_chunks(session: Session, versions: Sequence[VersionChunks]) -> None:
    """Write the chunks of many document versions in one statement; an older version can
    never overwrite a newer one. At most one entry per document (Postgres refuses to update
    one row twice in a statement)."""
    values = [_chunk_values(v, r) for v in versions for r in v.rows]
    if not values:
        return
    chunks = cast(Table, Chunk.__table__)
    statement = insert(chunks)
    excluded = statement.excluded
    # Executed with a list of rows: one cached statement whatever the count, which
    # SQLAlchemy sends as multi-row VALUES batches.
    session.connection().execute(
        statement.on_conflict_do_update(
            index_elements=[chunks.c.id, chunks.c.tenant_id],
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
                "first_sentence_tokens": excluded.first_sentence_tokens,
                "fingerprint": excluded.fingerprint,
                "embedding": excluded.embedding,
                "metadata": excluded.metadata,
                "updated_at": func.now(),
            },
            where=chunks.c.version <= excluded.version,
        ),
        values,
    )


def _chunk_values(v: VersionChunks, r: ChunkRow) -> dict[str, Any]:
    """One chunk row's columns, its bucket and fingerprint computed as both stores do."""
    return {
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
        "first_sentence_tokens": r.first_sentence_tokens,
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


def sample_chunk_texts(session: Session, tenant_id: str, size: int, seed: float) -> list[str]:
    """``size`` of the tenant's chunk texts, drawn in the order of a hash of their ids and
    ``seed``: the same ones for one seed while the chunks stay the same. (``setseed`` and
    ``random()`` were not: a parallel scan's workers draw from seeds of their own.)"""
    order = func.md5(func.concat(Chunk.id, str(seed)))
    query = select(Chunk.text).where(Chunk.tenant_id == tenant_id).order_by(order)
    return list(session.scalars(query.limit(size)))


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
    distance = Chunk.embedding.cosine_distance(_binary(vector)).label("distance")
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
    # The partition exists for its graph, but the planner may cost a scan of every row
    # below the walk (SciFact's 11,451 chunks after a reembed: a sequential scan, 31 ms,
    # where the walk takes 4.7 ms; which one it chose flipped with the table's statistics),
    # so without filters the scans that cannot order by distance are off for this
    # statement. With filters they stay on: a selective metadata filter is answered best by
    # a bitmap scan of its GIN index and a sort (0.16 ms; 8 ms with those scans off).
    walk_only = (
        ""
        if conditions
        else ", set_config('enable_seqscan', 'off', true)"
        ", set_config('enable_bitmapscan', 'off', true)"
    )
    session.execute(
        text(
            "SELECT set_config('hnsw.ef_search', :ef, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true)" + walk_only
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


def _binary(vector: list[float]) -> np.ndarray:
    """The query vector as numpy, so it is sent in pgvector's binary form (shared/vector_type:
    formatting 384 floats as text cost 0.36 ms a search, and Postgres parsed them again)."""
    return np.asarray(vector, dtype=np.float32)


# Whether a chunk is its document's only one (no second chunk at its version): a short whole
# document is its own answer, not a crumb of a longer one. Built once: aliasing the chunks
# table for each search cost more than the query itself (hydration 4.9 -> 2.4 ms a search
# on bench/query.py's 10,000-chunk tenant; the query runs in under 1 ms).
_SECOND_CHUNK = aliased(Chunk)
_WHOLE_DOCUMENT = and_(
    Chunk.ordinal == 0,
    ~exists().where(
        _SECOND_CHUNK.tenant_id == Chunk.tenant_id,
        _SECOND_CHUNK.document_id == Chunk.document_id,
        _SECOND_CHUNK.version == Chunk.version,
        _SECOND_CHUNK.ordinal == 1,
    ),
).label("whole_document")


def _live_chunks_query(with_cosine: bool) -> Select[Any]:
    """The live chunks among the ``ids`` parameter, of the ``tenant`` parameter's, with the
    cosine to the ``vector`` parameter (``with_cosine``) and the embeddings of those among
    ``embeddings_for``."""
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
        Chunk.first_sentence_tokens,
        Chunk.updated_at,
        Document.external_id,
        Document.title,
        _WHOLE_DOCUMENT,
    ]
    if with_cosine:
        vector = bindparam("vector", type_=Chunk.embedding.type)
        columns.append((1 - Chunk.embedding.cosine_distance(vector)).label("cosine"))
    # NULL except for ``embeddings_for`` (an empty list matches no id).
    embeddings_for = bindparam("embeddings_for", type_=ARRAY(String))
    columns.append(
        case((Chunk.id == any_(embeddings_for), vector_bytes(Chunk.embedding))).label("embedding")
    )
    tenant = bindparam("tenant", type_=String)
    return (
        select(*columns)
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.id == any_(bindparam("ids", type_=ARRAY(String))),
            Chunk.tenant_id == tenant,
            Document.tenant_id == tenant,
            Document.deleted.is_(False),
            Chunk.version == Document.version,
        )
    )


# Built once, as _WHOLE_DOCUMENT is: building the statement on every search (its columns, its
# conditions, the cache key SQLAlchemy derives from them) cost about as much as Postgres took
# to run it (bench/query.py's tenant, 20 ids: 2.0 ms a call, 1.0 ms of it the statement).
_LIVE_CHUNKS = {with_cosine: _live_chunks_query(with_cosine) for with_cosine in (False, True)}


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
    parameters: dict[str, Any] = {
        "ids": list(ids),
        "tenant": tenant_id,
        "embeddings_for": list(embeddings_for),
    }
    if vector is not None:
        parameters["vector"] = _binary(vector)
    rows = session.execute(_LIVE_CHUNKS[vector is not None], parameters).all()
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


def chunk_counts_by_tenant(session: Session) -> dict[str, int]:
    rows = session.execute(select(Chunk.tenant_id, func.count()).group_by(Chunk.tenant_id))
    return {tenant: int(n) for tenant, n in rows}


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


def chunks_after(
    session: Session, last_id: str, limit: int, tenant_id: str | None = None
) -> list[tuple[Chunk, Document]]:
    """The next page of chunks in id order (keyset pagination), with their documents: every
    tenant's, or ``tenant_id``'s only."""
    of_tenant = [Chunk.tenant_id == tenant_id] if tenant_id is not None else []
    rows = session.execute(
        select(Chunk, Document)
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.id > last_id, *of_tenant)
        .order_by(Chunk.id)
        .limit(limit)
    )
    return [(chunk, doc) for chunk, doc in rows]


# ------------------------------------------------------------------ partitions

SHARED_PARTITION = "chunks_shared"
_PARTITION_BOUND = re.compile(r"^FOR VALUES IN \('((?:[^']|'')*)'\)$")


def _literal(value: str) -> str:
    """A SQL string literal for DDL, which takes no bind parameters (tenant ids are
    [a-z0-9_-] already; the doubling makes any text safe)."""
    return "'" + value.replace("'", "''") + "'"


def _has_valid_graph(table: str) -> str:
    """SQL: whether the table ``table`` evaluates to (an oid) has a valid HNSW index (not one
    being built, nor one whose build failed)."""
    return (
        "EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        " JOIN pg_am am ON am.oid = ic.relam"
        f" WHERE i.indrelid = {table} AND am.amname = 'hnsw' AND i.indisvalid)"
    )


def tenant_exists(session: Session, tenant_id: str) -> bool:
    """(Asked here rather than of shared/tenants, which sits above the stores.)"""
    return session.get(Tenant, tenant_id) is not None


def own_partitions(session: Session) -> dict[str, tuple[str, bool]]:
    """tenant -> (its partition, whether that partition has a valid HNSW index), for every
    tenant with a partition of its own (the DEFAULT partition is nobody's own)."""
    rows = session.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), "
            + _has_valid_graph("c.oid")
            + " FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid"
            " WHERE h.inhparent = 'chunks'::regclass"
        )
    ).all()
    found = {}
    for name, bound, has_graph in rows:
        match = _PARTITION_BOUND.match(bound or "")
        if match:
            found[match.group(1).replace("''", "'")] = (name, bool(has_graph))
    return found


def has_own_graph(session: Session, partition: str) -> bool:
    """Whether ``partition`` exists with a valid HNSW index (not while one is being built,
    nor after a build that failed)."""
    query = "SELECT " + _has_valid_graph("to_regclass(:name)")
    return bool(session.scalar(text(query), {"name": partition}))


def shared_partition_sizes(session: Session, at_least: int) -> list[tuple[str, int]]:
    """(tenant, chunks) of the tenants in the shared partition with at least ``at_least``
    chunks, largest first."""
    rows = session.execute(
        text(
            f"SELECT tenant_id, count(*) FROM {SHARED_PARTITION} GROUP BY tenant_id"
            " HAVING count(*) >= :n ORDER BY count(*) DESC"
        ),
        {"n": at_least},
    ).all()
    return [(tenant, int(n)) for tenant, n in rows]


def move_to_own_partition(
    session: Session, tenant_id: str, partition: str, lock_timeout_ms: int
) -> int:
    """Move the tenant's rows out of the shared partition into a new partition of its own, in
    the caller's transaction; returns how many rows moved.

    Locks, in the order writers take them (documents, then chunks), so the move waits for
    writes in flight and holds new ones until it commits, and never deadlocks a writer: with
    ``lock_timeout`` below deadlock_timeout, it is always the move that gives up (the caller
    tries again later). Readers go on until the ATTACH, which holds the shared partition
    exclusively while it checks that none of the tenant's rows remain there."""
    session.execute(
        text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": f"{int(lock_timeout_ms)}ms"}
    )
    # SHARE ROW EXCLUSIVE: the new partition's foreign key needs it at ATTACH.
    session.execute(text("LOCK TABLE documents IN SHARE ROW EXCLUSIVE MODE"))
    session.execute(text(f"LOCK TABLE {SHARED_PARTITION} IN EXCLUSIVE MODE"))
    tenant = _literal(tenant_id)
    session.execute(text(f"CREATE TABLE {partition} (LIKE chunks INCLUDING DEFAULTS)"))
    # The partition's bound as a constraint first: ATTACH then skips scanning the new rows.
    session.execute(
        text(
            f"ALTER TABLE {partition} ADD CONSTRAINT {partition}_tenant"
            f" CHECK (tenant_id = {tenant})"
        )
    )
    result = session.execute(
        text(
            f"WITH moved AS (DELETE FROM {SHARED_PARTITION} WHERE tenant_id = :tenant RETURNING *)"
            f" INSERT INTO {partition} SELECT * FROM moved"
        ),
        {"tenant": tenant_id},
    )
    moved = getattr(result, "rowcount", 0)
    session.execute(
        text(f"ALTER TABLE chunks ATTACH PARTITION {partition} FOR VALUES IN ({tenant})")
    )
    return int(moved or 0)


# pg_try_advisory_lock's key for placement runs (any fixed bigint: "concpart" in ASCII).
_PLACEMENT_LOCK = 0x636F6E6370617274


def try_placement_lock(session: Session) -> bool:
    """The placement lock (see shared/db/repository.try_run_lock); False if another run
    holds it."""
    return try_run_lock(session, _PLACEMENT_LOCK)


def placement_unlock(session: Session) -> None:
    run_unlock(session, _PLACEMENT_LOCK)


def build_hnsw_graph(
    session: Session, partition: str, lock_timeout_ms: int, build_memory: str
) -> None:
    """The partition's HNSW index, built CONCURRENTLY (reads and writes go on meanwhile; the
    tenant's search is an exact scan until it is valid). An invalid one an interrupted build
    left is dropped first. The session's connection must be in autocommit (the placement
    lock's): these statements cannot run in a transaction.

    A concurrent build first waits for every transaction already open to end; one left open
    (a stuck client) would hold the build, and the worker running it, forever. So the waits
    have ``lock_timeout_ms``: past it the build fails (OperationalError) and leaves an invalid
    index, which the next run drops and builds again. ``build_memory`` is the build's
    maintenance_work_mem (settings.pg_graph_build_memory)."""
    connection = session.connection()
    index = f"{partition}_embedding_hnsw"
    try:  # the pooled connection gets its settings back whatever fails
        connection.execute(
            text("SELECT set_config('lock_timeout', :ms, false)"),
            {"ms": f"{int(lock_timeout_ms)}ms"},
        )
        connection.execute(
            text("SELECT set_config('maintenance_work_mem', :memory, false)"),
            {"memory": build_memory},
        )
        invalid = connection.scalar(
            text(
                "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:index)"
            ),
            {"index": index},
        )
        if invalid:
            connection.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {index}"))
        connection.execute(
            text(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {partition}"
                " USING hnsw (embedding vector_cosine_ops)"
            )
        )
        # A new table has no statistics until autovacuum comes by (a minute or more): until
        # then the planner took the exact sort over the graph (10,000 chunks: 17.8 ms, not 3).
        connection.execute(text(f"ANALYZE {partition}"))
    finally:
        connection.execute(text("SELECT set_config('lock_timeout', '0', false)"))
        connection.execute(text("RESET maintenance_work_mem"))


def rows_per_partition(session: Session) -> dict[str, int]:
    """partition name -> chunks it holds (a scan of every chunk: for operators, not paths)."""
    rows = session.execute(text("SELECT tableoid::regclass::text, count(*) FROM chunks GROUP BY 1"))
    return {name: int(n) for name, n in rows}
