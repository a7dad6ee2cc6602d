"""One error hierarchy that carries its HTTP status; the API renders every one the same way:
``{"error": {"code": ..., "message": ...}}``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


class ConcordError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = {}
        # For a request that fails its schema: each field at fault (path, message).
        self.fields: list[dict[str, str]] = []


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


class StoreConflict(StoreError):
    """A store refused a write because another got there first (a version conflict, a
    deadlock or serialization failure between two transactions, a unique key taken); the
    retry reads again and goes through. At the API a 503 with Retry-After, like the same
    deadlock met outside an adapter (at commit): the client's request did nothing wrong."""

    status_code = 503
    code = "store_conflict"

    def __init__(self, message: str, *, store: str = "", status: int | None = None) -> None:
        super().__init__(message, store=store, status=status)
        self.headers = {"Retry-After": "1"}


class ParseError(ConcordError):
    """The document cannot be turned into text; retrying will not help."""

    status_code = 422
    code = "unparseable_document"


def describe_validation_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """Pydantic's validation errors as one line: ``field.path message; ...``."""
    return "; ".join(f"{_path(e['loc'])} {_in_words(e)}" for e in errors)


def validation_error(errors: Iterable[Mapping[str, Any]]) -> ConcordError:
    """The one error a request that fails its schema gets, on every route: 422, a sentence
    per field at fault (the constraint in words, never a regular expression), and the fields
    one by one in ``fields``; or, for a body that is not JSON at all, 400 saying where it
    stopped parsing."""
    listed = list(errors)
    broken = next((e for e in listed if e.get("type") == "json_invalid"), None)
    if broken is not None:
        return BadRequest(f"the request body is not valid JSON: {_json_position(broken)}")
    error = InvalidRequest(
        "the request does not fit its schema: " + describe_validation_errors(listed)
    )
    error.fields = [{"path": _path(e["loc"]), "message": _in_words(e)} for e in listed]
    return error


def _path(loc: Iterable[Any]) -> str:
    """``body.policy.min_score``, ``query.limit``; list positions as ``[2]``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


# Pydantic's messages where they quote a pattern or read as code.
_WORDS = {
    "missing": "is required",
    "extra_forbidden": "is not a field this request takes",
    "string_pattern_mismatch": "is not in the allowed form",
    "string_too_short": "is too short",
    "string_too_long": "is too long",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "less_than_equal": "must be at most {le}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be below {lt}",
    "greater_than": "must be above {gt}",
}


def _in_words(error: Mapping[str, Any]) -> str:
    template = _WORDS.get(str(error.get("type")))
    if template is not None:
        try:
            return template.format(**(error.get("ctx") or {}))
        except (KeyError, IndexError):
            pass
    message = str(error.get("msg", "is not valid"))
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def _json_position(error: Mapping[str, Any]) -> str:
    """Where a body stopped parsing, in words: "it stops parsing at character 12: expecting
    property name enclosed in double quotes" (FastAPI's error has the position in its
    location, pydantic's own the line and column in its text)."""
    detail = str((error.get("ctx") or {}).get("error") or error.get("msg") or "")
    detail = detail.removeprefix("Invalid JSON: ")
    at = [part for part in error.get("loc", ()) if isinstance(part, int)]
    found = re.search(r"(?::)? ?(?:at )?line (\d+),? column (\d+)(?: \(char \d+\))?", detail)
    if found is not None:
        detail = detail[: found.start()].rstrip(" :,")
        where = f"line {found.group(1)}, column {found.group(2)}"
    elif at:
        where = f"character {at[-1]}"
    else:
        return "it does not parse"
    what = detail[:1].lower() + detail[1:]
    return f"it stops parsing at {where}" + (f": {what}" if what else "")
