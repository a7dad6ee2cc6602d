"""Work is bounded everywhere, so one tenant's large or odd document cannot hold up
anyone else's: bulk requests sized by bytes and split when refused, a document of
tens of thousands of chunks indexed completely."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from elastic_transport import ApiResponseMeta, HttpHeaders, NodeConfig
from elasticsearch import ApiError
from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.db.repository import count_rows
from shared.documents import repository as documents_repo
from shared.ingest import pipeline
from shared.jobs.repository import live_job_states
from shared.models import Chunk, DeadLetter, EsOutbox
from shared.relay import service as relay
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import RecordingQueue, es_chunks, paused, pg_chunks, upload_text


class RefusesRequestsHolding:
    """Elasticsearch, except that a bulk request holding ``poison`` is refused as a whole
    with ``status`` (413: the request is too large; 503: the node is overloaded)."""

    def __init__(self, poison: str, status: int) -> None:
        self.es, self.poison, self.status = get_es(), poison, status
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.es, name)

    def bulk(self, *, operations: list[dict[str, Any]], **kwargs: Any) -> Any:
        ids = {next(iter(line.values())).get("_id") for line in operations[::2]}
        if self.poison in ids and kwargs.get("require_alias"):  # the live write, not a dual one
            self.refused += 1
            meta = ApiResponseMeta(
                self.status, "1.1", HttpHeaders(), 0.0, NodeConfig("http", "x", 1)
            )
            raise ApiError(f"refused with {self.status}", meta, {"error": "refused"})
        return self.es.bulk(operations=operations, **kwargs)


@pytest.mark.parametrize(("status", "dead_lettered"), [(413, True), (503, False)])
def test_a_bulk_request_refused_whole_holds_back_only_the_row_that_causes_it(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
    status: int,
    dead_lettered: bool,
) -> None:
    with paused(worker):  # this test's relay is the only one
        ups = [
            upload_text(client, auth, f"bulk-{i}.txt", f"Bulk row {i} on kelp.") for i in range(6)
        ]
        for up in ups:
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(up["job_id"]))
        poison = f"{ups[2]['document_id']}:0"
        es = RefusesRequestsHolding(poison, status)
        report = relay.drain(replace(connect(), index=ElasticsearchChunkIndex(es)), unit_of_work)  # type: ignore[arg-type]
        with unit_of_work() as uow:
            left = list(
                uow.session.scalars(select(EsOutbox.chunk_id).where(EsOutbox.tenant_id == tenant))
            )
            letters = list(
                uow.session.scalars(select(DeadLetter).where(DeadLetter.tenant_id == tenant))
            )
            attempts = uow.session.scalars(
                select(EsOutbox.attempts).where(EsOutbox.chunk_id == poison)
            ).all()
    # The five others are in Elasticsearch after one drain; the offender is not.
    assert set(es_chunks(tenant)) == set(pg_chunks(tenant)) - {poison}
    assert es.refused >= 2  # the whole batch first, then the half holding it, ...
    if dead_lettered:  # too large will never pass: one dead letter with the reason
        assert report.dead_lettered == 1 and left == []
        assert [(d.ref, d.error_class) for d in letters] == [(poison, "es_413")]
    else:  # overloaded may pass later: the row alone waits, with its attempt counted
        assert report.dead_lettered == 0 and left == [poison] and attempts == [1]
        assert letters == []


def test_the_bulk_requests_of_one_batch_stay_within_the_byte_limit(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    sizes: list[int] = []

    class Measured:
        def __getattr__(self, name: str) -> Any:
            return getattr(get_es(), name)

        def bulk(self, *, operations: list[dict[str, Any]], **kwargs: Any) -> Any:
            import json

            sizes.append(sum(len(json.dumps(line).encode()) + 1 for line in operations))
            return get_es().bulk(operations=operations, **kwargs)

    settings = get_settings()
    limit = 20_000
    with paused(worker):
        ups = [
            upload_text(client, auth, f"bytes-{i}.txt", " ".join(["seagrass meadow"] * 400))
            for i in range(8)
        ]
        for up in ups:
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(up["job_id"]))
        original = settings.relay_bulk_bytes
        settings.relay_bulk_bytes = limit
        try:
            index = ElasticsearchChunkIndex(Measured(), settings)  # type: ignore[arg-type]
            relay.drain(replace(connect(), index=index), unit_of_work, settings=settings)
        finally:
            settings.relay_bulk_bytes = original
    assert len(sizes) > 1 and max(sizes) <= limit
    assert es_chunks(tenant) == pg_chunks(tenant)


def test_a_drain_stopped_by_its_batch_limit_asks_for_the_next_one(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain clears the request that started it as it starts, so rows it leaves behind at
    its batch limit or its deadline (a repair run from an admin's API request drains every
    tenant's rows, bounded by time) would wait for beat: it asks for the next drain itself,
    and only then."""
    queue = RecordingQueue("publish_relay", send=False)
    stores = replace(connect(), queue=queue)
    asked = queue.calls["publish_relay"]  # one () per request
    settings = get_settings()
    with paused(worker):
        ups = [upload_text(client, auth, f"limit-{i}.txt", f"Limit row {i}.") for i in range(6)]
        for up in ups:
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(up["job_id"]))
        original = settings.relay_batch_size
        settings.relay_batch_size = 2
        try:
            first = relay.drain(stores, unit_of_work, max_batches=1, settings=settings)
            assert first.claimed == 2 and len(asked) == 1
            late = relay.drain(
                stores,
                unit_of_work,
                max_batches=1_000,
                settings=settings,
                deadline=time.monotonic(),
            )
            assert late.claimed == 2 and len(asked) == 2  # one batch, then the deadline
            rest = relay.drain(stores, unit_of_work, max_batches=1_000, settings=settings)
        finally:
            settings.relay_batch_size = original
    assert rest.claimed >= 2 and len(asked) == 2  # it emptied the outbox: no more asks
    assert es_chunks(tenant) == pg_chunks(tenant)


def long_markdown(sections: int) -> bytes:
    """A document of ``sections`` short sections: one chunk each (each is more than a stub,
    which would join its neighbour, and well within the token budget), so tens of thousands
    of chunks fit within the upload limit."""
    return "".join(
        f"# Section {i}\nPart {i} of the long survey reports one more finding, the method "
        "that found it, and what its authors concluded from it in the end.\n"
        for i in range(sections)
    ).encode()


def test_a_document_of_many_chunks_is_indexed_completely_under_the_shipped_limits(
    tenant: str, worker: CeleryProcess, tmp_path: Path
) -> None:
    """More chunks than Postgres' 65,535 parameters allow in one multi-row statement of
    several columns (8,000 chunks of nine columns), and far more than one claimed batch
    holds: indexed whole, in both stores, by a worker with the shipped time and size limits.
    CONCORD_LONG_DOCUMENT_CHUNKS=30000 runs it at the manual size (bench/long_document.py
    times that size)."""
    from shared.documents.events import build_upload_event
    from shared.queue import publish_upload_event
    from shared.settings import Settings

    shipped = {
        name: str(Settings.model_fields[name].default)
        for name in ("task_soft_time_limit_s", "task_time_limit_s", "max_upload_bytes")
    }
    env = {f"CONCORD_{name.upper()}": value for name, value in shipped.items()}
    sections = int(os.environ.get("CONCORD_LONG_DOCUMENT_CHUNKS", "8000"))
    with paused(worker):  # only the worker with the shipped limits takes this document
        default_worker = CeleryProcess("worker", tmp_path, env)
        default_worker.start()
        try:
            publish_upload_event(
                build_upload_event(
                    tenant_id=tenant,
                    external_id="long.md",
                    raw=long_markdown(sections),
                    content_type="text/markdown",
                )
            )

            def indexed() -> str | None:
                with unit_of_work() as uow:
                    state = live_job_states(uow.session, tenant, ["long.md"]).get("long.md")
                assert state not in ("failed", "dead_lettered"), state
                return state if state == "indexed" else None

            wait_for(indexed, 900, interval=2, what=f"the {sections}-chunk document")

            def both_stores(expected: int) -> bool:
                es = get_es()
                es.indices.refresh(index=get_settings().es_chunks_alias())
                in_es = es.count(
                    index=get_settings().es_chunks_alias(), query={"term": {"tenant_id": tenant}}
                )["count"]
                with unit_of_work() as uow:
                    in_pg = count_rows(uow.session, Chunk, tenant)
                return bool(in_pg == in_es == expected)

            wait_for(lambda: both_stores(sections), 300, interval=2, what="every chunk in both")
            # Deleted again, so that later tests (a reindex, reconciles) do not carry it.
            from shared.documents.service import delete_document

            with unit_of_work() as uow:
                key = (tenant, "long.md")
                [doc] = documents_repo.documents_by_external_ids(uow.session, [key]).values()
                stores = connect()
                vectors = stores.vectors(uow.session)
                delete_document(uow, vectors, tenant, doc.id, queue=stores.queue)
            wait_for(lambda: both_stores(0), 300, interval=2, what="every chunk deleted")
        finally:
            default_worker.stop()
