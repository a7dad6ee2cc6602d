"""``concord mcp --stdio``: the MCP server for a desktop assistant, which starts it as a
child process and speaks the protocol over its stdin and stdout. Its tools call a Concord
API over HTTP with the key the assistant's configuration gives it, so the desktop needs no
database or index, only the API's address and a key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from concord_client import AsyncConcord
from mcp.server.mcpserver import Context

from services.mcp.tools import build_mcp_server


def serve_stdio(base_url: str, api_key: str) -> None:
    """Serve until the assistant closes stdin."""
    client = AsyncConcord(base_url, api_key)

    @asynccontextmanager
    async def connect(_: Context) -> AsyncIterator[AsyncConcord]:
        yield client

    server = build_mcp_server(connect)
    anyio.run(server.run_stdio_async)
