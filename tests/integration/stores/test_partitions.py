"""Tenant partitions of ``chunks`` (shared/stores/partitions.py) on the real stack: a large
tenant moves to a partition and HNSW graph of its own without losing a row, without changing
what its searches return, and without harming another tenant's ingest running meanwhile; a
move that meets a writer gives up instead of failing it; migration 0013 keeps every row."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from services.cli.stack import PostgresService
from shared.db import unit_of_work
from shared.migrate import alembic_config
from shared.settings import Settings, get_settings
from shared.stores import partitions, vector_store
from shared.stores import repository as stores_repo
from tests.conftest import admin_connection
from tests.helpers import key_headers, pg_chunks, search, upload_text, wait_converged

TOPICS = [
    "Okapis are forest giraffes with striped legs.",
    "Centrifugal pumps move water with a spinning impeller.",
    "Electric kettles boil water with a heating element.",
    "Honey bees dance to tell the hive where flowers grow.",
    "Glaciers carve valleys as they slowly flow downhill.",
    "Sourdough rises with wild yeast and lactic bacteria.",
]


def _placed(tenant: str | None = None, **overrides: Any) -> partitions.Placement:
    """A placement run (again while the test suite's beat has one under way)."""
    settings = get_settings().model_copy(update=overrides)
    placement = partitions.place_tenants(unit_of_work, settings, tenant_id=tenant, wait_s=10)
    assert not placement.skipped
    return placement


def _upload_corpus(client: TestClient, auth: dict[str, str], prefix: str, count: int) -> None:
    for i in range(count):
        upload_text(client, auth, f"{prefix}-{i}", f"{TOPICS[i % len(TOPICS)]} Note {i}.")


def _ranking(client: TestClient, auth: dict[str, str], query: str) -> list[str]:
    body = search(client, auth, query, mode="dense", top_k=5)
    return [r["external_id"] for r in body["results"]]


def _dense_plan(tenant: str) -> str:
    """The plan of a dense search of the tenant, with scans and sorts priced out (a few rows
    are cheaper to sort than to walk: the suite's tenants are small)."""
    vector = [0.05] * 384
    with unit_of_work() as uow:
        uow.session.execute(
            text(
                "SELECT set_config('enable_seqscan', 'off', true),"
                " set_config('enable_sort', 'off', true)"
            )
        )
        rows = uow.session.execute(
            text(
                "EXPLAIN SELECT id FROM chunks WHERE tenant_id = :t"
                " ORDER BY embedding <=> CAST(:v AS vector) LIMIT 5"
            ),
            {"t": tenant, "v": str(vector)},
        ).all()
    return "\n".join(r[0] for r in rows)


def test_a_large_tenant_moves_to_its_own_graph_while_another_tenant_ingests(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    _upload_corpus(client, auth, "doc", 18)
    before = wait_converged(tenant, timeout=120)
    queries = ["striped forest giraffe", "boiling water kettle", "bees and flowers"]
    rankings = {q: _ranking(client, auth, q) for q in queries}

    # Another tenant's uploads are being processed while the move runs.
    other = f"t-{uuid.uuid4().hex[:12]}"
    other_auth = key_headers(other, ["read", "write"])
    _upload_corpus(client, other_auth, "other", 12)  # fewer than the threshold below
    # Another small tenant stays in the shared partition: the threshold is per tenant.
    placement = _placed(tenant_partition_min_chunks=len(before))
    assert placement.moved.get(tenant) == len(before)
    assert other not in placement.moved and tenant in placement.graphs_built

    own = {view.tenant_id: view for view in partitions.describe(unit_of_work)}
    assert own[tenant].partition == partitions.partition_name(tenant)
    assert own[tenant].chunks == len(before) and own[tenant].graph == "hnsw"
    assert own[None].graph == "none"  # the shared partition has no graph

    # Nothing lost or changed: the same chunks at the same versions, in both stores.
    assert wait_converged(tenant) == before
    other_chunks = wait_converged(other, timeout=120)
    assert len(other_chunks) == 12  # every one of the other tenant's documents, indexed
    plan, other_plan = _dense_plan(tenant), _dense_plan(other)
    assert f"{partitions.partition_name(tenant)}_embedding_hnsw" in plan
    assert "chunks_shared" not in plan  # the walk stays in the tenant's own partition
    assert "hnsw" not in other_plan and "chunks_shared" in other_plan  # no graph to walk

    vector_store._own_graph.clear()  # the API's cached answer: searched through HNSW now
    assert {q: _ranking(client, auth, q) for q in queries} == rankings

    # Writes after the move land in the tenant's partition and its graph.
    upload_text(client, auth, "after-move", "Glaciers grind rock into fine silt.")
    after = wait_converged(tenant, timeout=60)
    assert len(after) == len(before) + 1
    assert _ranking(client, auth, "glacier rock silt")[0] == "after-move"
    assert _placed(tenant_partition_min_chunks=len(before)).moved == {}  # placed already


def test_a_move_that_meets_a_writer_gives_up_and_the_writer_commits(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    """The move locks documents then chunks with a lock_timeout below deadlock_timeout: a
    writer holding a lock is waited for briefly, then left alone (the next run moves)."""
    _upload_corpus(client, auth, "doc", 6)
    before = wait_converged(tenant, timeout=120)
    holding, release = threading.Event(), threading.Event()
    writer_error: list[BaseException] = []

    def writer() -> None:
        try:
            with unit_of_work() as uow:  # a writer mid-transaction on the documents table
                uow.session.execute(
                    text("UPDATE documents SET updated_at = now() WHERE tenant_id = :t"),
                    {"t": tenant},
                )
                holding.set()
                release.wait(30)
        except BaseException as e:
            writer_error.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(10)
        placement = _placed(tenant, tenant_partition_min_chunks=1)
        assert placement.busy == [tenant] and placement.moved == {}
    finally:
        release.set()
        thread.join(30)
    assert writer_error == []
    with unit_of_work() as uow:
        assert tenant not in stores_repo.own_partitions(uow.session)
    assert _placed(tenant, tenant_partition_min_chunks=1).moved == {tenant: len(before)}
    assert pg_chunks(tenant) == before


def test_one_placement_run_at_a_time(tenant: str) -> None:
    with unit_of_work() as uow:
        assert stores_repo.try_placement_lock(uow.session)
        try:
            placement = partitions.place_tenants(unit_of_work, tenant_id=tenant)
        finally:
            stores_repo.placement_unlock(uow.session)
    assert placement.skipped and placement.moved == {}


@pytest.fixture
def scratch_database() -> Any:
    """A database of its own, for migrating up and down without touching the suite's."""
    settings = get_settings().model_copy(
        update={"pg_database": f"concord_mig_{uuid.uuid4().hex[:8]}"}
    )
    with admin_connection() as conn:
        conn.execute(f'CREATE DATABASE "{settings.pg_database}"')
    yield settings
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{settings.pg_database}" WITH (FORCE)')


def test_migration_0013_keeps_every_row_up_and_down(scratch_database: Settings) -> None:
    settings, config = scratch_database, alembic_config(scratch_database)
    command.upgrade(config, "0012")
    scratch = PostgresService(settings)  # the suite's server, the scratch database
    document = uuid.uuid4()
    with scratch.connect(settings.pg_database) as conn:
        conn.execute("INSERT INTO tenants (id, name, created_at) VALUES ('mig', 'mig', now())")
        conn.execute(
            "INSERT INTO documents (id, tenant_id, external_id, title, metadata, version,"
            " content_hash, deleted, created_at, updated_at)"
            " VALUES (%s, 'mig', 'x', '', '{}', 1, 'h', false, now(), now())",
            (document,),
        )
        for i in range(3):
            conn.execute(
                "INSERT INTO chunks (id, tenant_id, document_id, version, ordinal, text, text_hash,"
                " char_start, char_end, section, embedding)"
                " VALUES (%s, 'mig', %s, 1, %s, 'text', 'h', 0, 4, '', %s)",
                (f"{document}:{i}", document, i, str([0.1] * 384)),
            )
    command.upgrade(config, "head")
    with scratch.connect(settings.pg_database) as conn:
        rows = conn.execute("SELECT tableoid::regclass::text, count(*) FROM chunks GROUP BY 1")
        assert rows.fetchall() == [("chunks_shared", 3)]
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'chunks'").fetchone()
        assert kind == ("p",)  # partitioned
    command.downgrade(config, "0012")
    with scratch.connect(settings.pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM chunks").fetchone() == (3,)
        hnsw = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_chunks_embedding_hnsw'"
        ).fetchone()
        assert hnsw == (1,)


def test_a_graph_build_held_by_an_open_transaction_gives_up_and_the_next_run_builds_it(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A concurrent index build waits for every transaction open before it; one left open
    (e.g. a client stopped mid-transaction) must not hold the build, and the worker running
    it, for ever."""
    _upload_corpus(client, auth, "doc", 4)
    before = wait_converged(tenant, timeout=120)
    monkeypatch.setattr(partitions, "GRAPH_LOCK_TIMEOUT_MS", 500)
    holding, release = threading.Event(), threading.Event()

    def open_transaction() -> None:
        with unit_of_work() as uow:  # a snapshot held open: a build must wait for it to end
            connection = uow.session.connection(
                execution_options={"isolation_level": "REPEATABLE READ"}
            )
            connection.execute(text("SELECT count(*) FROM tenants"))
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=open_transaction)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        placement = _placed(tenant, tenant_partition_min_chunks=1)
        took = time.monotonic() - started
    finally:
        release.set()
        thread.join(30)
    assert placement.moved == {tenant: len(before)} and placement.graphs_built == []
    assert placement.busy == [tenant] and took < 10
    with unit_of_work() as uow:
        assert stores_repo.own_partitions(uow.session)[tenant][1] is False  # left invalid
    assert _placed(tenant).graphs_built == [tenant]  # the next run drops it and builds again
    with unit_of_work() as uow:
        assert stores_repo.own_partitions(uow.session)[tenant][1] is True
    assert pg_chunks(tenant) == before


def test_placing_an_unknown_tenant_is_refused_and_leaves_the_others_alone(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    """`concord partitions place --tenant` with a typo: a clear error, exit 2, and no
    partition made for it; the tenant that does exist is placed by the next call as usual."""
    from typer.testing import CliRunner

    from services.cli.main import app

    _upload_corpus(client, auth, "doc", 3)
    before = wait_converged(tenant, timeout=120)
    typo = f"{tenant}-typo"
    result = CliRunner().invoke(app, ["partitions", "place", "--tenant", typo])
    assert result.exit_code == 2, result.output
    assert f"no tenant '{typo}'" in result.output
    with unit_of_work() as uow:
        own = stores_repo.own_partitions(uow.session)
    assert typo not in own and tenant not in own
    assert _placed(tenant).moved == {tenant: len(before)}
    assert pg_chunks(tenant) == before


def test_a_graph_build_memory_postgres_would_refuse_is_refused_at_start_up() -> None:
    assert Settings(pg_graph_build_memory="512MB").pg_graph_build_memory == "512MB"
    for wrong in ("3gb", "3 GB", "lots", ""):
        with pytest.raises(ValueError, match="CONCORD_PG_GRAPH_BUILD_MEMORY must be"):
            Settings(pg_graph_build_memory=wrong)


def test_a_graph_build_sets_its_memory_and_gives_the_connection_back_as_it_was(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    """The build runs with the build memory (a pooled connection must not keep it, nor the
    lock timeout), also when it fails."""
    _upload_corpus(client, auth, "doc", 2)
    wait_converged(tenant, timeout=120)
    assert _placed(tenant, tenant_partition_min_chunks=1).moved
    partition = partitions.partition_name(tenant)
    with unit_of_work() as uow:
        connection = uow.session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        seen: list[str] = []

        def watch(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if statement.startswith("CREATE INDEX"):
                seen.append(conn.exec_driver_sql("SHOW maintenance_work_mem").scalar())

        event.listen(connection, "before_cursor_execute", watch)
        try:
            connection.execute(text(f"DROP INDEX IF EXISTS {partition}_embedding_hnsw"))
            stores_repo.build_hnsw_graph(uow.session, partition, 10_000, "777MB")
            assert seen == ["777MB"]
            assert connection.exec_driver_sql("SHOW maintenance_work_mem").scalar() == "64MB"
            assert connection.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
            with pytest.raises(DBAPIError):  # Postgres refuses the size: nothing stays behind
                stores_repo.build_hnsw_graph(uow.session, partition, 10_000, "3 parsecs")
            assert connection.exec_driver_sql("SHOW maintenance_work_mem").scalar() == "64MB"
            assert connection.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
        finally:
            event.remove(connection, "before_cursor_execute", watch)
    with unit_of_work() as uow:
        assert stores_repo.own_partitions(uow.session)[tenant][1] is True
