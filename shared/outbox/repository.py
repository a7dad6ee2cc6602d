"""All SQL of the Elasticsearch outbox: the rows that carry chunk writes and deletes from the
transaction that made them to the relay. Functions take a session and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.db.repository import count_rows, insert_rows
from shared.models import EsOutbox, OutboxOp


@dataclass(frozen=True)
class OutboxEntry:
    tenant_id: str
    document_id: uuid.UUID
    op: OutboxOp
    version: int
    chunk_ids: Sequence[str]


def add_outbox(
    session: Session,
    *,
    tenant_id: str,
    document_id: uuid.UUID,
    op: OutboxOp,
    version: int,
    chunk_ids: Sequence[str],
) -> None:
    add_outbox_entries(session, [OutboxEntry(tenant_id, document_id, op, version, chunk_ids)])


def add_outbox_entries(session: Session, entries: Sequence[OutboxEntry]) -> None:
    """One outbox row per chunk id of every entry, in one statement."""
    values = [
        {
            "tenant_id": e.tenant_id,
            "document_id": e.document_id,
            "chunk_id": cid,
            "op": e.op.value,
            "version": e.version,
        }
        for e in entries
        for cid in e.chunk_ids
    ]
    insert_rows(session, EsOutbox, values)


# Due rows in round-robin order over tenants (each tenant's oldest rows first, then each
# one's next ones): tenants found by a loose index scan of ix_es_outbox_tenant (one probe per
# tenant with rows), each one's first due rows by a probe more.
_ROUND_ROBIN_DUE = text(
    """
    WITH RECURSIVE tenants AS (
      (SELECT tenant_id FROM es_outbox ORDER BY tenant_id LIMIT 1)
      UNION ALL
      SELECT (SELECT o.tenant_id FROM es_outbox o WHERE o.tenant_id > t.tenant_id
              ORDER BY o.tenant_id LIMIT 1)
      FROM tenants t WHERE t.tenant_id IS NOT NULL
    )
    SELECT turns.id FROM tenants t
    CROSS JOIN LATERAL (
      SELECT o.id, row_number() OVER (ORDER BY o.id) AS turn
      FROM es_outbox o
      WHERE o.tenant_id = t.tenant_id AND o.next_attempt_at <= now()
      ORDER BY o.id
      LIMIT :limit
    ) turns
    WHERE t.tenant_id IS NOT NULL
    ORDER BY turns.turn, turns.id
    LIMIT :limit
    """
)


def claim_outbox(session: Session, limit: int) -> Sequence[EsOutbox]:
    """Due rows, taken round-robin over tenants (one tenant's 100,000 queued chunk writes
    never hold up another's few), locked so that concurrent relays never send the same row
    twice (a row another relay holds is skipped, not waited for)."""
    # Twice the batch: candidates another relay locks meanwhile are skipped.
    turns = list(session.scalars(_ROUND_ROBIN_DUE, {"limit": 2 * limit}))
    if not turns:
        return []
    return session.scalars(
        select(EsOutbox).from_statement(_LOCK_IN_TURN),
        {"ids": turns, "limit": limit},
    ).all()


# The first ``limit`` of ``ids`` that no one else holds, locked, in the order given.
_LOCK_IN_TURN = text(
    """
    SELECT o.* FROM es_outbox o
    JOIN unnest(CAST(:ids AS bigint[])) WITH ORDINALITY AS turn(id, n) ON o.id = turn.id
    ORDER BY turn.n
    LIMIT :limit
    FOR UPDATE OF o SKIP LOCKED
    """
)


def due_outbox_rows_for(session: Session, chunk_ids: Sequence[str]) -> int:
    """Rows of these chunks that are due, whether or not a relay holds them right now."""
    return count_rows(
        session,
        EsOutbox,
        None,
        any_of(EsOutbox.chunk_id, chunk_ids),
        EsOutbox.next_attempt_at <= func.now(),
    )


def outbox_rows_for(session: Session, chunk_ids: Sequence[str]) -> int:
    """Rows of these chunks still in the outbox, due or postponed."""
    return count_rows(session, EsOutbox, None, any_of(EsOutbox.chunk_id, chunk_ids))


def chunks_with_queued_writes(
    session: Session, ids: Sequence[str], tenant_id: str | None = None
) -> set[str]:
    """The chunks among ``ids`` that already have an outbox row waiting (a repair queued by an
    earlier reconcile, or an ingest write not yet relayed): queuing another would only repeat
    it. With ``tenant_id``, only rows for that tenant's index count."""
    if not ids:
        return set()
    query = select(EsOutbox.chunk_id).where(any_of(EsOutbox.chunk_id, ids))
    if tenant_id is not None:
        query = query.where(EsOutbox.tenant_id == tenant_id)
    return set(session.scalars(query))


def delete_outbox(session: Session, ids: Sequence[int]) -> None:
    if ids:
        session.execute(delete(EsOutbox).where(any_of(EsOutbox.id, ids)))


def postpone_outbox(
    session: Session, ids: Sequence[int], delay_s: float, error: str, count_attempt: bool
) -> None:
    if not ids:
        return
    values: dict[str, Any] = {
        "next_attempt_at": func.now() + timedelta(seconds=delay_s),
        "last_error": error[:2000],
    }
    if count_attempt:
        values["attempts"] = EsOutbox.attempts + 1
    session.execute(update(EsOutbox).where(any_of(EsOutbox.id, ids)).values(**values))


def outbox_backlog(session: Session, tenant_id: str | None = None) -> int:
    return count_rows(session, EsOutbox, tenant_id)
