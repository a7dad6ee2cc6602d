"""Small factories and probes shared by the integration tests."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from shared.db import unit_of_work
from shared.models import Chunk, Document, EsOutbox
from shared.settings import get_settings
from shared.stores.elastic import get_es
from tests.conftest import wait_for


def upload_text(
    client: TestClient,
    auth: dict[str, str],
    external_id: str,
    text: str,
    title: str = "",
    **extra: Any,
) -> dict[str, Any]:
    response = client.post(
        "/v1/documents",
        headers=auth,
        json={"external_id": external_id, "text": text, "title": title, **extra},
    )
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


def wait_job(
    client: TestClient,
    auth: dict[str, str],
    job_id: str,
    state: str = "indexed",
    timeout: float = 90,
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        return body if body["state"] == state else None

    return dict(wait_for(done, timeout, what=f"job {job_id} to reach {state}"))


def pg_chunks(tenant: str) -> dict[str, int]:
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.id, Chunk.version).where(Chunk.tenant_id == tenant)
        ).all()
    return {cid: version for cid, version in rows}


def es_chunks(tenant: str) -> dict[str, int]:
    es = get_es()
    alias = get_settings().es_chunks_alias()
    es.indices.refresh(index=alias)
    hits = es.search(
        index=alias, query={"term": {"tenant_id": tenant}}, size=10_000, version=True, source=False
    )["hits"]["hits"]
    return {hit["_id"]: hit["_version"] for hit in hits}


def outbox_empty() -> bool:
    with unit_of_work() as uow:
        return (uow.session.scalar(select(func.count()).select_from(EsOutbox)) or 0) == 0


def wait_converged(tenant: str, timeout: float = 60) -> dict[str, int]:
    """Until Elasticsearch holds exactly Postgres's chunks at Postgres's versions."""

    def converged() -> dict[str, int] | None:
        pg = pg_chunks(tenant)
        return pg if outbox_empty() and es_chunks(tenant) == pg else None

    return dict(wait_for(converged, timeout, interval=0.5, what=f"stores to agree for {tenant}"))


def document_count(tenant: str) -> int:
    with unit_of_work() as uow:
        return (
            uow.session.scalar(
                select(func.count()).select_from(Document).where(Document.tenant_id == tenant)
            )
            or 0
        )
