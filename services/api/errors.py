"""Concord's error body, for handlers and for ASGI apps that answer before any route."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def error_body(
    code: str, message: str, status: int, fields: list[dict[str, str]] | None = None
) -> JSONResponse:
    """Every error's body: ``{"error": {"code", "message"[, "fields"]}}``."""
    error: dict[str, object] = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return JSONResponse({"error": error}, status_code=status)
