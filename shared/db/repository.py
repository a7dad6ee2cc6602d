"""The statements that belong to no domain: the database clock, advisory locks, generic row
inserts and counts, the schema revision, and creating a database before any schema exists."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg import sql
from sqlalchemy import Table, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.models import Base


def now(session: Session) -> datetime:
    """The database clock, so leases compare against one clock whatever the host."""
    return session.execute(select(func.now())).scalar_one()


def wal_lsn(session: Session) -> str:
    """The primary's WAL written so far: every transaction committed until now ends at or
    before it."""
    return str(session.scalar(text("SELECT pg_current_wal_lsn()::text")))


def replayed_past(session: Session, lsn: str) -> bool:
    """Whether this replica has replayed the WAL up to ``lsn`` (False on a primary)."""
    return bool(
        session.scalar(
            text("SELECT coalesce(pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn), false)"),
            {"lsn": lsn},
        )
    )


def limit_statements(session: Session, seconds: float) -> None:
    """Postgres cancels any statement of this transaction that runs longer than ``seconds``
    (a lock wait included), with an error the caller sees as ``OperationalError``."""
    session.execute(
        text("SELECT set_config('statement_timeout', :ms, true)"),
        {"ms": str(max(1, round(seconds * 1000)))},
    )


def schema_revision(session: Session) -> str | None:
    """The Alembic revision the database is at (None before the first migration)."""
    revision = session.scalar(text("SELECT version_num FROM alembic_version"))
    return None if revision is None else str(revision)


def lock_key(session: Session, key: str) -> None:
    """Serialize writers of one document (or one external id) until the transaction ends."""
    lock_keys(session, [key])


def lock_keys(session: Session, keys: Sequence[str]) -> None:
    """:func:`lock_key` for many keys in one round trip, always in the same (sorted) order, so
    that two writers of overlapping sets cannot deadlock."""
    session.execute(
        text(
            "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) "
            "FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS t(k, n) ORDER BY n"
        ),
        {"keys": sorted(set(keys))},
    )


def try_run_lock(session: Session, key: int) -> bool:
    """Puts the session's connection in autocommit (the session's first use must be this) and
    takes the session-level advisory lock ``key`` on it, for a run that only one process may
    make at a time; False if another connection holds it. The lock lasts until ``run_unlock``
    or the connection's end, whichever comes first (a crashed run's ends with it)."""
    connection = session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return bool(
        connection.scalar(text("SELECT pg_try_advisory_lock(CAST(:key AS bigint))"), {"key": key})
    )


def run_unlock(session: Session, key: int) -> None:
    session.connection().execute(
        text("SELECT pg_advisory_unlock(CAST(:key AS bigint))"), {"key": key}
    )


def insert_rows(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """Rows of ``model``'s table (column values by name) in one executemany: one cached
    statement whatever the count, which SQLAlchemy sends as multi-row VALUES batches."""
    if rows:
        session.connection().execute(insert(cast(Table, model.__table__)), rows)


def count_rows(session: Session, model: Any, tenant_id: str | None = None, *conditions: Any) -> int:
    """Rows of ``model`` matching ``conditions``, within one tenant unless ``tenant_id`` is
    None (the operator's view of every tenant)."""
    if tenant_id is not None:
        conditions = (*conditions, model.tenant_id == tenant_id)
    return session.scalar(select(func.count()).select_from(model).where(*conditions)) or 0


def ensure_database(connection: psycopg.Connection[Any], name: str) -> None:
    """Create the database ``name`` unless it exists, over an autocommit connection to another
    database (CREATE DATABASE cannot run in a transaction, nor before the schema exists)."""
    exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if not exists:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def is_standby(connection: psycopg.Connection[Any]) -> bool:
    """Whether the server ``connection`` reaches is a replica replaying a primary's WAL."""
    row = connection.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def replication_slot_state(connection: psycopg.Connection[Any], slot: str) -> str | None:
    """The primary's physical replication slot's ``wal_status`` (reserved, extended, unreserved,
    lost), or None when there is no such slot."""
    row = connection.execute(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return None if row is None else str(row[0])


def drop_replication_slot(connection: psycopg.Connection[Any], slot: str) -> None:
    connection.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
        " WHERE slot_name = %s AND NOT active",
        (slot,),
    )
