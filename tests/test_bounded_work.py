"""Issue 18: work is bounded everywhere, so one tenant's large or odd document cannot hold up
anyone else's: bulk requests sized by bytes and split when refused, a very long document
indexed completely."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from elastic_transport import ApiResponseMeta, HttpHeaders, NodeConfig
from elasticsearch import ApiError
from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.ingest import pipeline, relay
from shared.models import DeadLetter, EsOutbox
from shared.settings import get_settings
from shared.stores.elastic import get_es
from tests.conftest import CeleryProcess
from tests.helpers import es_chunks, paused, pg_chunks, upload_text


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
        if self.poison in ids and kwargs.get("index") == get_settings().es_chunks_alias():
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
            pipeline.process_job(uuid.UUID(up["job_id"]))
        poison = f"{ups[2]['document_id']}:0"
        es = RefusesRequestsHolding(poison, status)
        report = relay.drain(es=es)  # type: ignore[arg-type]
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
            pipeline.process_job(uuid.UUID(up["job_id"]))
        original = settings.relay_bulk_bytes
        settings.relay_bulk_bytes = limit
        try:
            relay.drain(es=Measured(), settings=settings)  # type: ignore[arg-type]
        finally:
            settings.relay_bulk_bytes = original
    assert len(sizes) > 1 and max(sizes) <= limit
    assert es_chunks(tenant) == pg_chunks(tenant)
