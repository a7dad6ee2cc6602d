"""The FastAPI application: ingest, jobs, search, health and metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from services.api.readiness import readiness_checks
from services.api.routes import admin, documents, jobs, search
from shared.errors import ConcordError
from shared.logs import configure_json_logging, new_request_id, request_id_var
from shared.metrics import API_REQUEST_SECONDS, SystemCollector
from shared.settings import get_settings

CONSOLE_DIR = Path(__file__).resolve().parent / "console"

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
    configure_json_logging()
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
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")

    @app.middleware("http")
    async def _request_context(request: Request, call_next: Any) -> Response:
        """A request id for the logs (and the jobs it creates), echoed in X-Request-ID, and
        the route's latency under its template (``/v1/documents/{document_id}``)."""
        request_id = new_request_id(request.headers.get("x-request-id"))
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500
        try:
            response: Response = await call_next(request)
            status = response.status_code
            response.headers["X-Request-ID"] = request_id
            return response
        finally:
            route = request.scope.get("route")
            template = getattr(route, "path", "unmatched")
            API_REQUEST_SECONDS.labels(request.method, template, f"{status // 100}xx").observe(
                time.perf_counter() - started
            )
            request_id_var.reset(token)

    @app.exception_handler(ConcordError)
    async def _concord_error(_: Request, exc: ConcordError) -> JSONResponse:
        response = error_body(exc.code, exc.message, exc.status_code)
        response.headers.update(exc.headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return error_body("invalid_request", problems, 422)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        """The process is up (no store is asked)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """Ready to serve: Postgres, Elasticsearch and Redis answer and migrations are current."""
        checks = readiness_checks(get_settings())
        ready = all(c["ok"] for c in checks.values())
        return JSONResponse(
            {"status": "ready" if ready else "unready", "checks": checks},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app
