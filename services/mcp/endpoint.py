"""The MCP server in the API process, at ``/mcp`` over the Streamable HTTP transport.

Each MCP request is authenticated like any API request (the key as ``Authorization: Bearer``,
the wrong-key limiter, the key's rate limit) before the protocol reads it, and is refused
with Concord's error body otherwise. A tool then calls the API's own routes in-process (an
``httpx.ASGITransport`` over this app) as the principal already authenticated, so scopes,
search admission, body limits, error handling and request logs are the routes' own, and the
rate limit counts each POST of the protocol once (a tool call, a tools/list, an initialize).
Stateless (each POST stands alone, answered with JSON), so any API process behind a load
balancer can answer any MCP request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from concord_client import AsyncConcord
from concord_client._calls import RetryPolicy
from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.deps import PRINCIPAL_SCOPE_KEY, authenticate
from services.api.errors import error_body
from services.mcp.tools import build_mcp_server
from shared.errors import ConcordError
from shared.settings import Settings
from shared.tenants.service import Principal

PATH = "/mcp"
# The in-process API's base URL (never resolved: the transport hands requests to the app).
_IN_PROCESS = "http://concord.internal"


class McpEndpoint:
    """The ASGI app served at ``/mcp``: authentication, then the SDK's transport."""

    def __init__(self, api: ASGIApp, settings: Settings) -> None:
        self.server: MCPServer = build_mcp_server(self._connect)
        self.api = api
        # The caller's key is the protection: a page that rebinds a name to this host cannot
        # send it, so the SDK's Host/Origin allow-list (made for unauthenticated local
        # servers) would only refuse the API's own public names.
        self.sessions = StreamableHTTPSessionManager(
            app=self.server._lowlevel_server,
            json_response=True,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=settings.max_request_bytes,
        )
        self.transport = StreamableHTTPASGIApp(self.sessions)

    def lifespan(self) -> Any:
        """Run for the app's life: the session manager's task group."""
        return self.sessions.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        header = request.headers.get("authorization", "")
        secret = header[7:].strip() if header[:7].lower() == "bearer " else None
        try:
            principal = await authenticate(request, secret or request.headers.get("x-api-key"))
        except ConcordError as e:
            # the app's error body, and where to send the key, as RFC 6750 asks of a 401
            headers = {**e.headers}
            if e.status_code == 401:
                headers["WWW-Authenticate"] = 'Bearer realm="concord"'
            response = error_body(e.code, e.message, e.status_code, e.fields)
            response.headers.update(headers)
            await response(scope, receive, send)
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.transport(scope, receive, send)

    @asynccontextmanager
    async def _connect(self, ctx: Context) -> AsyncIterator[AsyncConcord]:
        """A client that calls this app's routes as the MCP request's principal."""
        request = ctx.request_context.request
        if not isinstance(request, Request):  # pragma: no cover - the SDK passes it over HTTP
            raise RuntimeError("an MCP tool was called without its HTTP request")
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        if not isinstance(principal, Principal):  # pragma: no cover - __call__ set it
            raise RuntimeError("an MCP request reached a tool unauthenticated")
        client_address = request.client or ("unknown", 0)
        transport = httpx.ASGITransport(
            app=_as_principal(self.api, principal),
            client=(client_address[0], client_address[1]),
        )
        request_id = request.headers.get("x-request-id")
        headers = {"X-Request-ID": request_id} if request_id else {}
        async with httpx.AsyncClient(
            transport=transport, base_url=_IN_PROCESS, headers=headers
        ) as http:
            # No retries in-process: a 429 or 503 goes back to the MCP caller as a tool error
            # naming its Retry-After (waiting here would hold the request and its slot).
            yield AsyncConcord(http_client=http, api_key="", retry=RetryPolicy(max_retries=0))


def _as_principal(api: ASGIApp, principal: Principal) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await api({**scope, PRINCIPAL_SCOPE_KEY: principal}, receive, send)

    return app


def mount(app: FastAPI, settings: Settings) -> McpEndpoint:
    """Serve MCP at ``/mcp`` (POST; GET and DELETE answer 405 in stateless mode)."""
    endpoint = McpEndpoint(app, settings)
    app.router.routes.append(
        Route(PATH, endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    )
    return endpoint
