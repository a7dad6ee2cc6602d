"""Request bodies are bounded before anything reads them.

FastAPI reads and parses a JSON body whole before a route's dependencies run, the API key
check among them, so without a bound any caller (no key needed) could make the process hold
and parse hundreds of megabytes. Uploads have a limit of their own
(``CONCORD_MAX_UPLOAD_BYTES``, enforced while their route streams the body); every other body
may hold at most ``CONCORD_MAX_REQUEST_BYTES``. A declared length over the limit is refused
without reading a byte; a chunked body is read only up to the limit."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_upload(scope: Scope) -> bool:
    """``POST /v1/documents``: bounded by its route, while it streams, at the upload limit."""
    return bool(scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/documents")


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, limit: int, exempt: Callable[[Scope], bool] = is_upload
    ) -> None:
        self.app = app
        self.limit = limit
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or self.exempt(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, f"the request body is {int(declared)} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._refuse(send, "the request body is longer")
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _refuse(self, send: Send, what: str) -> None:
        payload = json.dumps(
            {
                "error": {
                    "code": "payload_too_large",
                    "message": f"{what}; the limit is {self.limit} bytes "
                    "(CONCORD_MAX_REQUEST_BYTES)",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    # the rest of the body is not read: the client must not reuse the connection
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body as one message, then the connection's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
