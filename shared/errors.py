"""One error hierarchy that carries its HTTP status; the API renders every one the same way:
``{"error": {"code": ..., "message": ...}}``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class ConcordError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = {}


class BadRequest(ConcordError):
    status_code = 400
    code = "bad_request"


class Unauthorized(ConcordError):
    status_code = 401
    code = "unauthorized"


class Forbidden(ConcordError):
    status_code = 403
    code = "forbidden"


class NotFound(ConcordError):
    status_code = 404
    code = "not_found"


class Conflict(ConcordError):
    status_code = 409
    code = "conflict"


class InvalidRequest(ConcordError):
    """A request that is well-formed JSON but asks for something that cannot be done (a
    webhook URL that may not be sent to, say): the same status and code as a body that
    fails its schema."""

    status_code = 422
    code = "invalid_request"


class PayloadTooLarge(ConcordError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(ConcordError):
    status_code = 415
    code = "unsupported_media_type"


class TooManyRequests(ConcordError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}


class StoreError(ConcordError):
    """A store's failure in Concord's terms: the store adapters (shared/stores) raise these
    from their driver's errors, so no caller reads a driver's exception types. ``status`` is
    the store's own answer (an HTTP status), None where it gave none (refused, reset, timed
    out)."""

    def __init__(self, message: str, *, store: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.store = store
        self.status = status


class StoreUnavailable(StoreError):
    """A store (Postgres, Elasticsearch, Redis) could not be reached, or answered that it
    cannot take the request now (429, 5xx); retriable."""

    status_code = 503
    code = "store_unavailable"

    def __init__(self, message: str, *, store: str = "", status: int | None = None) -> None:
        super().__init__(message, store=store, status=status)
        self.headers = {"Retry-After": "5"}  # as the API's answer to a driver's own outage


class StoreRejected(StoreError):
    """A store refused the request itself (a 4xx other than 429: a missing index, a request
    too large, one it cannot parse); the same request is refused again."""

    status_code = 502
    code = "store_rejected"


class ParseError(ConcordError):
    """The document cannot be turned into text; retrying will not help."""

    status_code = 422
    code = "unparseable_document"


def describe_validation_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """Pydantic's validation errors as one line: ``field.path: message; ...``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
