"""The FastAPI application: ingest, jobs, search, health and metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kombu.exceptions
import redis
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.body_limit import BodyLimitMiddleware
from services.api.errors import error_body
from services.api.openapi import describe_operations
from services.api.readiness import readiness_checks
from services.api.routes import admin, documents, jobs, search
from services.api.warm_up import WarmUp
from services.mcp import endpoint as mcp
from shared.db import unit_of_work
from shared.errors import ConcordError, validation_error
from shared.logs import configure_json_logging, new_request_id, request_id_var
from shared.metrics import API_REQUEST_SECONDS, SystemCollector
from shared.queue import TaskQueue
from shared.settings import get_settings
from shared.stores.compose import Stores, connect

CONSOLE_DIR = Path(__file__).resolve().parent / "console"

log = logging.getLogger(__name__)


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods under which some route fully matches the path (routers nest, so ask each
    top-level route under each method rather than reading their method sets)."""
    return [
        method
        for method in HTTP_METHODS
        if any(r.matches({**scope, "method": method})[0] == Match.FULL for r in app.router.routes)
    ]


# A store that cannot be reached (refused, reset, timed out) makes a request fail with 503 and
# Retry-After, which clients may retry, not a 500. Errors of the request itself stay 4xx.
STORE_ERRORS: dict[type[Exception], str] = {
    sqlalchemy.exc.OperationalError: "Postgres",
    sqlalchemy.exc.InterfaceError: "Postgres",
    # every pooled connection busy past the pool's wait (a slow or stalled Postgres)
    sqlalchemy.exc.TimeoutError: "Postgres",
    redis.ConnectionError: "Redis",
    redis.TimeoutError: "Redis",
    kombu.exceptions.OperationalError: "Redis",
}


def _store_unavailable(store: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handler(_: Request, exc: Exception) -> Response:
        log.warning("%s unavailable: %s: %s", store, type(exc).__name__, exc)
        response = error_body("store_unavailable", f"{store} is unavailable; retry shortly", 503)
        response.headers["Retry-After"] = "5"
        return response

    return handler


_system_metrics: list[SystemCollector] = []  # registered once per process


def _register_system_metrics(queue: TaskQueue) -> None:
    """Once per process, however many apps the tests create: read through the first app's
    queue."""
    if not _system_metrics:
        _system_metrics.append(SystemCollector(unit_of_work, queue))
        REGISTRY.register(_system_metrics[0])


class RequestContextMiddleware:
    """A request id for the logs (and the jobs it creates), echoed in X-Request-ID, and the
    route's latency under its template (``/v1/documents/{document_id}``). Plain ASGI rather
    than ``@app.middleware("http")``, whose wrapping of every response cost about 1 ms."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw_id = headers.get(b"x-request-id")
        request_id = new_request_id(raw_id.decode("latin-1") if raw_id else None)
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_request_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_request_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            API_REQUEST_SECONDS.labels(scope["method"], template, f"{status // 100}xx").observe(
                time.perf_counter() - started
            )
            request_id_var.reset(token)


def create_app(warm_up: WarmUp | None = None, stores: Stores | None = None) -> FastAPI:
    """The API process's composition root. ``warm_up``: what the app loads once it starts
    (services/api/warm_up.py); its steps can be replaced (a test holds one to see /readyz
    wait). ``stores``: the stores its routes work with (``StoresDep``), the real ones by
    default."""
    configure_json_logging()
    stores = stores or connect(get_settings())
    _register_system_metrics(stores.queue)
    warming = warm_up or WarmUp()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # In a thread: the app answers /readyz (503 until done) while the models load.
        warming.start()
        async with mcp_endpoint.lifespan():
            yield

    # /docs and /redoc from the Swagger UI and ReDoc files fastapi-offline ships, served at
    # /docs-assets: the pages load on a machine without internet (FastAPI's own load them
    # from a CDN).
    app = FastAPIOffline(
        lifespan=lifespan,
        title="Concord",
        version="0.1.0",
        description="Hybrid retrieval over Postgres/pgvector and Elasticsearch.",
        static_url="/docs-assets",
    )
    app.state.stores = stores
    if warming.stores is None:  # the queue's producer it warms is the routes' own
        warming.stores = app.state.stores
    app.include_router(documents.router)
    app.include_router(jobs.router)
    app.include_router(search.router)
    app.include_router(admin.router)
    _fastapi_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe_operations(_fastapi_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")
    mcp_endpoint = mcp.mount(app, get_settings())

    app.add_middleware(BodyLimitMiddleware, limit=get_settings().max_request_bytes)
    app.add_middleware(RequestContextMiddleware)  # outermost: a 413 gets a request id too

    _add_error_handlers(app)
    _add_probes(app, warming)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in Concord's one shape: its own, routing's, a store's, validation's."""

    @app.exception_handler(ConcordError)
    async def _concord_error(_: Request, exc: ConcordError) -> JSONResponse:
        response = error_body(exc.code, exc.message, exc.status_code, exc.fields)
        response.headers.update(exc.headers)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Routing errors (404 unknown path, 405) in Concord's error shape. Starlette's 405
        names only the methods of the first route that matched the path; ``Allow`` must list
        every method the path supports."""
        code = "method_not_allowed" if exc.status_code == 405 else "http_error"
        response = error_body(code, str(exc.detail), exc.status_code)
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        elif exc.headers:
            response.headers.update(exc.headers)
        return response

    for error_class, store in STORE_ERRORS.items():
        app.add_exception_handler(error_class, _store_unavailable(store))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        error = validation_error(exc.errors())
        return error_body(error.code, error.message, error.status_code, error.fields)


def _add_probes(app: FastAPI, warming: WarmUp) -> None:
    """Liveness, readiness (the warm-up and the stores) and the metrics."""

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        """The process is up (no store is asked)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """Ready to serve: the start-up warm-up is done, Postgres, Elasticsearch and Redis
        answer and migrations are current."""
        checks = {
            "warm_up": warming.check(),
            **readiness_checks(get_settings(), app.state.stores.index),
        }
        ready = all(c["ok"] for c in checks.values())
        return JSONResponse(
            {"status": "ready" if ready else "unready", "checks": checks},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)
