"""The FastAPI application: ingest, jobs, search, health and metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from services.api.routes import admin, documents, jobs, search
from shared.errors import ConcordError
from shared.metrics import SystemCollector

log = logging.getLogger(__name__)


def error_body(code: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


@lru_cache(maxsize=1)
def _register_system_metrics() -> None:
    """Once per process, however many apps the tests create."""
    REGISTRY.register(SystemCollector())


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    # Load the models before the first request, so no request's budget pays for loading.
    await run_in_threadpool(_warm_up)
    yield


def _warm_up() -> None:
    from shared.ingest.embedding import get_embedder
    from shared.search.rerank import warm_up

    get_embedder().embed_query("warm up")
    warm_up()


def create_app() -> FastAPI:
    _register_system_metrics()
    app = FastAPI(
        lifespan=_lifespan,
        title="Concord",
        version="0.1.0",
        description="Hybrid retrieval over Postgres/pgvector and Elasticsearch.",
    )
    app.include_router(documents.router)
    app.include_router(jobs.router)
    app.include_router(search.router)
    app.include_router(admin.router)

    @app.exception_handler(ConcordError)
    async def _concord_error(_: Request, exc: ConcordError) -> JSONResponse:
        return error_body(exc.code, exc.message, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return error_body("invalid_request", problems, 422)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app
