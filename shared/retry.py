"""Which errors are worth retrying, and how an error is described where others may read it.

A store that cannot be reached (Postgres, Elasticsearch, Redis) is retried with backoff; any
other error is a property of the work itself and fails it at once.
"""

from __future__ import annotations

import random

import redis
from billiard.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError

from shared.errors import ConcordError, StoreConflict, StoreUnavailable
from shared.text import storable_text

RETRIABLE: tuple[type[BaseException], ...] = (
    OperationalError,
    StoreUnavailable,
    StoreConflict,  # a write that lost a race: the retry reads again
    redis.ConnectionError,
    # A task past its soft time limit: the work it did is kept (embeddings are cached as
    # they are made, see shared/ingest/steps.embed_step), so the next attempt goes further.
    SoftTimeLimitExceeded,
    # A process out of memory: not a property of the one piece of work that met it (in an
    # ingest batch, another tenant's document may hold the memory). The ingest pipeline
    # counts it as an attempt lost, like a time limit, so a document that exhausts memory
    # on its own soon runs alone and uses up its own attempts (shared/jobs/service.runs_alone).
    MemoryError,
)

MAX_ERROR_MESSAGE_CHARS = 1000


def is_retriable(error: BaseException) -> bool:
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, DBAPIError) and sqlstate(error).startswith(WORK_OVER_A_LIMIT):
        return False
    return isinstance(error, RETRIABLE)


# Postgres' class 54, "program limit exceeded" (an index row or a statement too large):
# psycopg raises it as an OperationalError, like an outage, but it is the work's own and a
# retry meets it again. Retried, one job's row released its whole batch, over and over, and
# the task's own job (any tenant's) was dead-lettered for it; not retried, the batch falls
# back to one job at a time and the job that meets it fails alone.
WORK_OVER_A_LIMIT = "54"


def sqlstate(error: BaseException) -> str:
    """Postgres' SQLSTATE of a database error SQLAlchemy wraps ("" for any other error)."""
    return str(getattr(getattr(error, "orig", None), "sqlstate", None) or "")


def server_message(orig: BaseException) -> str | None:
    """The server's primary message of a driver's database error, without the statement and
    parameters its text quotes (None when the error carries none)."""
    primary = getattr(getattr(orig, "diag", None), "message_primary", None)
    return str(primary) if primary else None


def retry_delay(retries: int, base: float = 2.0, cap: float = 120.0) -> float:
    """Exponential backoff with jitter, in seconds, before retry number ``retries + 1``."""
    return float(min(cap, base * 2**retries) * random.uniform(0.5, 1.0))


def describe_error(error: BaseException) -> str:
    """The message recorded on a job or dead letter, which its tenant can read. A database
    error's text carries its statement and parameters (every row of a batch, of any tenant):
    only the server's primary message is kept. Storable text: a library's message may quote
    the upload's content, NUL included, and a message Postgres refuses would fail the write
    that records the failure, and with it every job of the batch."""
    if isinstance(error, ConcordError):
        message = error.message
    elif isinstance(error, StatementError) and error.orig is not None:
        orig = error.orig
        primary = server_message(orig) or str(orig).split("\n", 1)[0]
        message = f"{type(orig).__name__}: {primary}"
    else:
        message = str(error) or type(error).__name__
    return storable_text(message[:MAX_ERROR_MESSAGE_CHARS])
