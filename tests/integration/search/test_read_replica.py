"""The query path on a real streaming replica: searches read it once it has
replayed everything committed before they began; with its replay paused (lag injected) a
document's new version is still what every mode serves, read from the primary; a replica that
is down costs nothing but the fallback."""

from __future__ import annotations

import shutil
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.cli.stack import PostgresReplicaService
from shared import db
from shared.db import repository as db_repo
from shared.metrics import SEARCH_READS
from shared.settings import Settings, get_settings
from tests.conftest import wait_for
from tests.helpers import search, upload_text, wait_converged


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reset_read_engine() -> None:
    if db.get_read_engine.cache_info().currsize and (engine := db.get_read_engine()):
        engine.dispose()
    db.get_read_engine.cache_clear()
    db._read_session_factory.cache_clear()


@pytest.fixture
def replica(monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresReplicaService]:
    """A hot standby of the suite's Postgres (pg_basebackup from the same binaries, under the
    state directory, where the service user can reach it), read by the in-process API."""
    base = get_settings()
    state = base.state_path() / f"test-replica-{uuid.uuid4().hex[:8]}"
    settings = base.model_copy(update={"state_dir": state, "pg_replica_port": _free_port()})
    state.mkdir(parents=True)
    state.chmod(0o755)
    service = PostgresReplicaService(settings)
    service.up()
    monkeypatch.setattr(base, "pg_read_url", settings.read_dsn() or "")
    _reset_read_engine()
    try:
        yield service
    finally:
        _reset_read_engine()
        service.remove()
        shutil.rmtree(state, ignore_errors=True)


def _on_replica(service: PostgresReplicaService, statement: str) -> None:
    with service.connect(service.s.pg_database) as conn:
        conn.execute(statement)


def _caught_up() -> bool:
    with db.unit_of_work() as uow:
        position = db_repo.wal_lsn(uow.session)
    with db.read_unit_of_work() as uow:
        return db_repo.replayed_past(uow.session, position)


def _reads(source: str) -> float:
    return float(SEARCH_READS.labels(source)._value.get())


def _served(client: TestClient, auth: dict[str, str], query: str) -> dict[str, set[Any]]:
    """Per mode: the (version, text) of every result of the document ``doc``."""
    served = {}
    for mode in MODES:
        body = search(client, auth, query, mode=mode, top_k=5)
        assert body["degraded"] == [], body["degraded"]
        served[mode] = {
            (r["version"], r["text"]) for r in body["results"] if r["external_id"] == "doc"
        }
    return served


MODES = ("dense", "lexical", "hybrid")


def _in_every_mode(version: int, text: str) -> dict[str, set[Any]]:
    """What ``_served`` answers when every mode serves the document at ``version`` alone."""
    return {mode: {(version, text)} for mode in MODES}


V1 = "Okapis live in the Ituri rainforest and browse on leaves."
V2 = "Okapis were described by science in 1901 from skins sent to London."


def test_searches_read_the_replica_and_a_lagging_one_never_serves_the_old_version(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: Any,
    replica: PostgresReplicaService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A search waits for the replica to replay the cluster's WAL as it stood when the search
    # began, and the suite's other workers write to the same cluster all the while: on two
    # loaded cores the replay can trail them by more than the shipped 50 ms, and a search
    # then reads the primary, as it should. What is checked here is where a search reads,
    # so the reads that must go to the replica may wait for it longer; the paused replica is
    # met with the shipped wait.
    shipped_wait = get_settings().pg_read_max_wait_ms
    monkeypatch.setattr(get_settings(), "pg_read_max_wait_ms", 5000.0)
    upload_text(client, auth, "doc", V1)
    wait_converged(tenant)
    # The replica may still be replaying the upload (by more than a search waits for it).
    wait_for(_caught_up, 30, what="the replica to replay the upload")
    before = _reads("replica")
    assert _served(client, auth, "okapi rainforest leaves") == _in_every_mode(1, V1)
    assert _reads("replica") == before + 3  # all three read the replica

    _on_replica(replica, "SELECT pg_wal_replay_pause()")  # the replica stops at version 1
    monkeypatch.setattr(get_settings(), "pg_read_max_wait_ms", shipped_wait)
    try:
        assert upload_text(client, auth, "doc", V2)["version"] == 2
        wait_converged(tenant)
        fallbacks = _reads("primary_fallback")
        # Every mode serves version 2, read from the primary: none serves what the replica
        # still holds.
        assert _served(client, auth, "okapi described science 1901 skins") == _in_every_mode(2, V2)
        assert _reads("primary_fallback") == fallbacks + 3
    finally:
        _on_replica(replica, "SELECT pg_wal_replay_resume()")
    monkeypatch.setattr(get_settings(), "pg_read_max_wait_ms", 5000.0)
    wait_for(_caught_up, 30, what="the replica to replay the backlog")
    before = _reads("replica")
    assert _served(client, auth, "okapi described science 1901 skins") == _in_every_mode(2, V2)
    assert _reads("replica") == before + 3  # caught up: read from the replica again


def test_a_replica_that_is_down_falls_back_to_the_primary(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: Any,
    replica: PostgresReplicaService,
) -> None:
    upload_text(client, auth, "doc", V1)
    wait_converged(tenant)
    replica.down()
    fallbacks = _reads("primary_fallback")
    assert _served(client, auth, "okapi rainforest leaves") == _in_every_mode(1, V1)
    assert _reads("primary_fallback") == fallbacks + 3


def test_without_a_replica_every_read_is_the_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(pg_read_url="", pg_replica_port=0)
    assert settings.read_dsn() is None
    assert ":5999/" in (Settings(pg_replica_port=5999).read_dsn() or "")
    url = Settings(pg_read_url="postgresql://u:p@replica:5432/concord").read_dsn()
    assert url == "postgresql+psycopg://u:p@replica:5432/concord"
    with pytest.raises(ValueError, match="CONCORD_PG_READ_URL must be a postgresql:// URL"):
        Settings(pg_read_url="replica:5432")
