"""Every store adapter raises Concord's store errors (shared/errors.StoreError), never its
driver's, so no caller reads a driver's exception types: StoreUnavailable where the store gave
no answer or cannot take the request now (retriable), StoreConflict where it refused a write
because another got there first (retriable: the retry reads again), StoreRejected where it
refused the request itself (the same request is refused again).

``translating`` makes an adapter class do this for every public method; the translations of
Postgres' and Redis' errors are here, Elasticsearch's beside its client (shared/stores/elastic.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import redis.exceptions
from redis.exceptions import RedisError, ResponseError
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    PendingRollbackError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from shared.errors import StoreConflict, StoreError, StoreRejected, StoreUnavailable
from shared.retry import WORK_OVER_A_LIMIT, server_message, sqlstate

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def translating(
    driver_errors: tuple[type[BaseException], ...], translate: Callable[[Any], StoreError]
) -> Callable[[type[T]], type[T]]:
    """A class decorator: every public method of the adapter raises ``translate(error)``
    where the driver raised one of ``driver_errors`` (the method's own handling of a driver
    error, a 404 read as empty, comes first)."""

    def decorate(cls: type[T]) -> type[T]:
        for name, member in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(member):
                setattr(cls, name, _translated(member, driver_errors, translate))
        return cls

    return decorate


def _translated(
    method: Callable[P, R],
    driver_errors: tuple[type[BaseException], ...],
    translate: Callable[[Any], StoreError],
) -> Callable[P, R]:
    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except driver_errors as e:
            raise translate(e) from e

    return call


# ------------------------------------------------------------------ Postgres

POSTGRES = "Postgres"
# A write that lost to a concurrent one: a serialization failure, a deadlock, a unique key
# another transaction took. Retried, the transaction reads again and goes through.
CONFLICT_SQLSTATES = {"40001", "40P01", "23505"}


def postgres_error(error: SQLAlchemyError) -> StoreError:
    """SQLAlchemy's error (around psycopg's) as Concord's. The message is the server's
    primary one: the statement and its parameters (rows of any tenant) stay out of it."""
    state = sqlstate(error)
    message = f"{POSTGRES}: {_primary_message(error)}" + (f" ({state})" if state else "")
    if state in CONFLICT_SQLSTATES:
        return StoreConflict(message, store=POSTGRES)
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return StoreUnavailable(message, store=POSTGRES)
    if state.startswith(WORK_OVER_A_LIMIT):  # psycopg's OperationalError, but the request's own
        return StoreRejected(message, store=POSTGRES)
    unavailable = (
        OperationalError,  # connection refused or lost, a statement cancelled past its limit
        InterfaceError,
        DisconnectionError,
        PoolTimeoutError,  # no connection free in the pool in time
        PendingRollbackError,  # the transaction was lost to an earlier failure
    )
    if isinstance(error, unavailable):
        return StoreUnavailable(message, store=POSTGRES)
    return StoreRejected(message, store=POSTGRES)


def _primary_message(error: SQLAlchemyError) -> str:
    orig = getattr(error, "orig", None)
    if orig is None:
        return type(error).__name__
    first_line = str(orig).splitlines()[0] if str(orig) else ""
    return server_message(orig) or f"{type(orig).__name__}: {first_line}"


raises_postgres_errors = translating((SQLAlchemyError,), postgres_error)


# ------------------------------------------------------------------ Redis

REDIS = "Redis"
# Answers that refuse a command for now, not for what it is: out of memory, a replica that
# is read-only or has lost its master, a cluster not ready. redis-py raises each as a class of
# its own and drops the code from the message; a script still running keeps its "BUSY".
TRANSIENT_REDIS_ANSWERS = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


def refused_for_now(error: RedisError) -> bool:
    """A Redis answer that refuses the command for now (a retry later may pass)."""
    return isinstance(error, TRANSIENT_REDIS_ANSWERS) or str(error).startswith("BUSY")


def redis_error(error: RedisError) -> StoreError:
    """An answer refusing the command itself (a wrong type, a script's error) is
    StoreRejected; no answer (refused, reset, timed out, loading) or a refusal for now (out
    of memory, read-only) StoreUnavailable."""
    if isinstance(error, ResponseError) and not refused_for_now(error):
        return StoreRejected(f"{REDIS}: {error}", store=REDIS)
    return StoreUnavailable(f"{REDIS}: {type(error).__name__}", store=REDIS)


raises_redis_errors = translating((RedisError,), redis_error)


# ------------------------------------------------------------------ the broker (Celery on Redis)


def broker_error(error: Exception) -> StoreError:
    """The task queue's broker could not take a message or answer: StoreUnavailable."""
    return StoreUnavailable(f"{REDIS} (the task queue): {type(error).__name__}", store=REDIS)
