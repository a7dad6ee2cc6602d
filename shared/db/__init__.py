"""Engine and unit of work. Only the boundary (a route, a task, a CLI command) opens a unit of
work, and only it commits: a service receives the boundary's ``UnitOfWork``, or, when its work
spans several transactions (the ingest steps, reconcile ranges, search arms on threads), the
boundary's ``Transactions`` factory and opens each transaction with it. The database clock and
the few statements that belong to no domain are in ``shared/db/repository.py``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Engine, any_, bindparam, create_engine, event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker

from shared.settings import get_settings


@lru_cache
def get_engine() -> Engine:
    """Created on first use in each process, never at import (Celery prefork safe)."""
    return _engine(get_settings().postgres_dsn(), connect_timeout_s=5)


def _engine(dsn: str, connect_timeout_s: int) -> Engine:
    engine = create_engine(
        dsn,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=10,
        connect_args={"connect_timeout": connect_timeout_s},
    )
    event.listen(engine, "do_connect", _name_connection)
    return engine


def _name_connection(dialect: Any, record: Any, args: Any, params: dict[str, Any]) -> None:
    """Each connection names the process that opened it (``concord-<pid>``, as the OS knows
    it when the connection opens: a Celery pool child's own), so pg_stat_activity and
    pg_locks tell an operator which process holds a transaction or a lock."""
    params["application_name"] = f"concord-{os.getpid()}"


@lru_cache
def _session_factory() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@lru_cache
def get_read_engine() -> Engine | None:
    """The streaming replica the query path reads from (``Settings.read_dsn``), or None."""
    dsn = get_settings().read_dsn()
    if dsn is None:
        return None
    return _engine(dsn, connect_timeout_s=2)


@lru_cache
def _read_session_factory() -> sessionmaker[Session] | None:
    engine = get_read_engine()
    return None if engine is None else sessionmaker(bind=engine, expire_on_commit=False)


def replica_configured() -> bool:
    return get_read_engine() is not None


class UnitOfWork:
    """A session plus work to run only once its transaction has committed (enqueueing tasks:
    a worker must never see pre-commit state) and dropped on rollback."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._after_commit: list[Callable[[], object]] = []

    def after_commit(self, action: Callable[[], object]) -> None:
        self._after_commit.append(action)

    def run_after_commit(self) -> None:
        actions, self._after_commit = self._after_commit, []
        for action in actions:
            action()


@contextmanager
def unit_of_work() -> Iterator[UnitOfWork]:
    """One transaction: committed when the block ends, rolled back if it raises; the actions
    registered with ``after_commit`` run after the commit."""
    session = _session_factory()()
    uow = UnitOfWork(session)
    try:
        yield uow
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
    uow.run_after_commit()


@contextmanager
def read_unit_of_work() -> Iterator[UnitOfWork]:
    """One read-only transaction on the replica (see shared/db/replica.py for when a search
    may use it); nothing is committed there, a replica takes no writes."""
    factory = _read_session_factory()
    if factory is None:
        raise RuntimeError("no read replica is configured (CONCORD_PG_READ_URL)")
    session = factory()
    try:
        yield UnitOfWork(session)
        session.rollback()
    finally:
        session.close()


# What a boundary hands a service whose work spans several transactions: ``unit_of_work``.
Transactions = Callable[[], AbstractContextManager[UnitOfWork]]


def dispose_engine_after_fork() -> None:
    """Drop pooled connections inherited across fork (they belong to the parent)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose(close=False)
    if get_read_engine.cache_info().currsize and (engine := get_read_engine()) is not None:
        engine.dispose(close=False)


def starts_with(column: QueryableAttribute[str], prefix: str) -> ColumnElement[bool]:
    """``column LIKE prefix%`` with the prefix's own ``%``, ``_`` and ``\\`` taken literally."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.like(escaped + "%", escape="\\")


def any_of(column: QueryableAttribute[Any], values: Iterable[Any]) -> ColumnElement[bool]:
    """``column = ANY(:values)``: one array parameter however many values. (An ``IN`` list
    binds a parameter per value, and Postgres refuses a statement with more than 65,535.)"""
    return column == any_(bindparam(None, list(values), type_=ARRAY(column.type)))
