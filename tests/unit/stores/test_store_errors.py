"""Every store adapter raises Concord's store errors, never its driver's: callers (the relay,
the search's arms, reconcile, the ingest pipeline's retries, the admin views) catch StoreError
alone, and tell the failure classes apart by type: StoreUnavailable (no answer, or not now:
retried), StoreConflict (lost a race: retried), StoreRejected (the request's own: not
retried). What a real store answers to each is in tests/contract/test_store_failures.py."""

from __future__ import annotations

import inspect
import uuid
from typing import Any

import numpy as np
import pytest
import redis
import sqlalchemy.exc
from elastic_transport import ApiResponseMeta, HttpHeaders, NodeConfig
from elasticsearch import ApiError, ConnectionError, Elasticsearch
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from shared.errors import StoreConflict, StoreRejected, StoreUnavailable
from shared.retry import is_retriable
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.driver_errors import postgres_error, redis_error
from shared.stores.elastic import store_error
from shared.stores.schemas import ChunkRow, VersionChunks
from shared.stores.snapshots import RedisSnapshots
from shared.stores.vector_store import PgVectorStore

LINES = [("t-1", [{"index": {"_id": "d:0"}}, {"text": "kelp"}])]
# A call of every public method that reaches Elasticsearch (forget only drops a cache entry).
CALLS: dict[str, tuple[Any, ...]] = {
    "layout": (),
    "per_tenant": (),
    "prepare": (["t-1"],),
    "bulk": (LINES,),
    "reindex_target": (),
    "bulk_to": ("g2", LINES),
    "exists": ("t-1", "d:0"),
    "count_of_tenant": ("t-1",),
    "count_of_document": ("t-1", "d"),
    "cluster_status": (1.0,),
    "lexical_search": ("t-1", "kelp forests", None, 5),
    "term_counts": ("t-1", ["kelp"]),
    "refresh": ("t-1",),
    "tenants": (),
    "bucket_stats": ("t-1",),
    "copies_in_buckets": ("t-1", [1, 2]),
    "foreign_copies": ("t-1",),
    "fingerprints_in_buckets": ("t-1", [1]),
    "copies_by_ids": (["d:0"],),
    "start_reindex": (),
    "mark_reindex_progress": ("g2", "d:0"),
    "finish_reindex": ("g2",),
}


def _unreachable() -> ElasticsearchChunkIndex:
    # an alias of its own: no layout this process read of the suite's index is reused
    settings = get_settings().model_copy(update={"es_index_prefix": "unreachable-test"})
    return ElasticsearchChunkIndex(Elasticsearch("http://127.0.0.1:9", max_retries=0), settings)


def test_every_method_raises_store_unavailable_when_elasticsearch_does_not_answer() -> None:
    public = {  # every role's (shared/stores/chunk_index/)
        name
        for role in ElasticsearchChunkIndex.__mro__
        for name, member in vars(role).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    assert public - set(CALLS) <= {"forget", "write", "copy_to"}
    index = _unreachable()
    for name, args in CALLS.items():
        with pytest.raises(StoreUnavailable) as raised:
            getattr(index, name)(*args)
        assert raised.value.status is None and raised.value.store == "Elasticsearch", name
        assert isinstance(raised.value.__cause__, ConnectionError), name
        assert raised.value.headers == {"Retry-After": "5"}  # the API's 503 says when to retry


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, StoreRejected), (404, StoreRejected), (409, StoreConflict), (413, StoreRejected),
     (429, StoreUnavailable), (500, StoreUnavailable), (503, StoreUnavailable)],
)  # fmt: skip
def test_an_answer_keeps_its_status_and_only_429_and_5xx_are_worth_a_retry(
    status: int, kind: type[Exception]
) -> None:
    meta = ApiResponseMeta(status, "1.1", HttpHeaders(), 0.0, NodeConfig("http", "x", 1))
    error = store_error(ApiError("refused", meta, {"error": "refused"}))
    assert type(error) is kind and error.status == status


# ------------------------------------------------------------------ Postgres (the vector store)

ROW = ChunkRow("d:0", 0, "Kelp.", "h", 0, 5, "", 1, np.zeros(4, dtype=np.float32))
VERSION = VersionChunks("t-1", uuid.uuid4(), 1, "x", "X", {}, [ROW])
DOCUMENT = uuid.uuid4()
VECTOR = [0.1] * 4
PG_CALLS: dict[str, tuple[Any, ...]] = {
    "upsert": ([VERSION],),
    "delete_superseded": ({DOCUMENT: 2},),
    "nearest": ("t-1", VECTOR, 5),
    "hydrate": ("t-1", ["d:0"], VECTOR),
    "embeddings": ("t-1", ["d:0"]),
    "metadata_values": ("t-1", ["d:0"], "year"),
    "document_chunks": ("t-1", DOCUMENT),
    "chunks_by_ids": (["d:0"],),
    "count_of_tenant": ("t-1",),
    "count_of_document": (DOCUMENT,),
    "counts_by_tenant": (),
    "sample_texts": ("t-1", 5),
    "tenants": (),
    "bucket_stats": ("t-1",),
    "fingerprints_in_buckets": ("t-1", [1]),
    "fingerprints_by_ids": ("t-1", ["d:0"]),
    "owners": (["d:0"],),
    "count_up_to": ("d:0",),
    "page_after": ("", 5),
}


def test_every_vector_store_method_raises_store_unavailable_when_postgres_does_not_answer() -> None:
    public = {
        name
        for name, member in vars(PgVectorStore).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    assert public == set(PG_CALLS)
    engine = create_engine("postgresql+psycopg://concord@127.0.0.1:9/none", poolclass=NullPool)
    for name, args in PG_CALLS.items():
        with Session(engine) as session, pytest.raises(StoreUnavailable) as raised:
            getattr(PgVectorStore(session), name)(*args)
            pytest.fail(f"{name} reached no Postgres and raised nothing")
        assert raised.value.store == "Postgres", name
        assert isinstance(raised.value.__cause__, sqlalchemy.exc.OperationalError), name
        assert is_retriable(raised.value)


class _Diag:
    message_primary = "the server's own words"


class _PsycopgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"{sqlstate}\nDETAIL: Key (id)=(tenant secret) already exists.")
        self.sqlstate = sqlstate
        self.diag = _Diag()


@pytest.mark.parametrize(
    ("wrapper", "sqlstate", "kind"),
    [(sqlalchemy.exc.OperationalError, "08006", StoreUnavailable),  # the connection failed
     (sqlalchemy.exc.OperationalError, "57014", StoreUnavailable),  # cancelled past its limit
     (sqlalchemy.exc.OperationalError, "40P01", StoreConflict),  # a deadlock
     (sqlalchemy.exc.OperationalError, "40001", StoreConflict),  # a serialization failure
     (sqlalchemy.exc.IntegrityError, "23505", StoreConflict),  # a unique key taken
     (sqlalchemy.exc.IntegrityError, "23503", StoreRejected),  # a foreign key missing
     (sqlalchemy.exc.OperationalError, "54000", StoreRejected),  # a row over a limit
     (sqlalchemy.exc.DataError, "22000", StoreRejected),  # a vector of the wrong size
     (sqlalchemy.exc.ProgrammingError, "42703", StoreRejected)],
)  # fmt: skip
def test_a_postgres_error_is_classed_by_its_sqlstate_and_keeps_the_statement_out(
    wrapper: type[sqlalchemy.exc.DBAPIError], sqlstate: str, kind: type[Exception]
) -> None:
    error = postgres_error(
        wrapper("INSERT INTO chunks VALUES (%(text)s)", {"text": "a tenant's row"},
                _PsycopgError(sqlstate))
    )  # fmt: skip
    assert type(error) is kind and error.store == "Postgres"
    assert error.message == f"Postgres: the server's own words ({sqlstate})"
    assert is_retriable(error) is (kind is not StoreRejected)


def test_a_transaction_lost_to_an_earlier_failure_is_unavailable() -> None:
    assert type(postgres_error(sqlalchemy.exc.PendingRollbackError("rolled back"))) is (
        StoreUnavailable
    )


# ------------------------------------------------------------------ Redis (search snapshots)


def test_snapshots_raise_store_unavailable_when_redis_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = redis.Redis(port=9, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr(RedisSnapshots, "_redis", lambda self: silent)
    snapshots = RedisSnapshots(get_settings())
    for call in (lambda: snapshots.put("t-1", "a" * 22, b"x"), lambda: snapshots.get("a" * 22)):
        with pytest.raises(StoreUnavailable) as raised:
            call()
        assert raised.value.store == "Redis"
        assert isinstance(raised.value.__cause__, redis.exceptions.ConnectionError)


class _Parser(BaseParser):  # redis-py's reading of an error answer, without a connection
    def on_connect(self, connection: Any) -> None: ...
    def on_disconnect(self) -> None: ...


@pytest.mark.parametrize(
    ("answer", "kind"),
    [("WRONGTYPE Operation against a key holding the wrong kind of value", StoreRejected),
     ("ERR Error running script (call to f_1): user_script:1: oops", StoreRejected),
     ("OOM command not allowed when used memory > 'maxmemory'.", StoreUnavailable),
     ("READONLY You can't write against a read only replica.", StoreUnavailable),
     ("BUSY Redis is busy running a script. You can only call SCRIPT KILL", StoreUnavailable),
     ("LOADING Redis is loading the dataset in memory", StoreUnavailable),
     ("MASTERDOWN Link with MASTER is down", StoreUnavailable)],
)  # fmt: skip
def test_a_redis_answer_is_rejected_only_when_it_refuses_the_command_itself(
    answer: str, kind: type[Exception]
) -> None:
    """Error answers as the server sends them, read by redis-py's own parser (which turns
    "OOM ..." into an OutOfMemoryError without the code)."""
    assert type(redis_error(_Parser().parse_error(answer))) is kind
    assert type(redis_error(redis.exceptions.TimeoutError("Timeout reading"))) is StoreUnavailable
