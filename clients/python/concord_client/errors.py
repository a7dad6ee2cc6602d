"""What the client raises: the server's error body as an exception, one class per kind of
failure a caller handles differently."""

from __future__ import annotations

from typing import Any

import httpx


class ConcordError(Exception):
    """Any failure the client reports."""


class APIError(ConcordError):
    """The server answered with an error: its status and its body's ``code`` and ``message``
    (``fields`` names the invalid fields of a 422)."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        fields: list[dict[str, Any]] | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.fields = fields or []
        self.body = body
        self.retry_after = retry_after


class BadRequest(APIError):
    """400, 413, 415 or 422: the request itself is wrong; sending it again will not help."""


class AuthenticationError(APIError):
    """401: no key, or an unknown or revoked one."""


class PermissionDenied(APIError):
    """403: the key lacks the scope (read, write, admin) the operation needs."""


class NotFound(APIError):
    """404: no such document, job or cursor for the key's tenant."""


class Conflict(APIError):
    """409: the request conflicts with the tenant's state (a model out of date, a limit)."""


class RateLimited(APIError):
    """429: the key's rate limit or the tenant's share of concurrent searches; retried by the
    client (after ``Retry-After``) before it is raised."""


class ServiceUnavailable(APIError):
    """503, or another 5xx: a store the server needs is down; retried before it is raised."""


class JobFailed(ConcordError):
    """An ingest job ended failed or dead-lettered; ``job`` is its last view."""

    def __init__(self, job: Any) -> None:
        error = getattr(job, "error", None)
        reason = f": {error.message}" if error is not None else ""
        super().__init__(f"job {job.id} ended {job.state}{reason}")
        self.job = job


class JobTimeout(ConcordError, TimeoutError):
    """A job was still queued or running when the wait's timeout passed."""

    def __init__(self, job: Any, timeout: float) -> None:
        super().__init__(f"job {job.id} still {job.state} after {timeout:g} s")
        self.job = job


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    415: BadRequest,
    422: BadRequest,
    429: RateLimited,
}


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (Concord sends seconds, never an HTTP date)."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from(response: httpx.Response) -> APIError:
    """The exception for an error response, carrying Concord's error body
    (``{"error": {"code", "message"[, "fields"]}}``) or, from a proxy, the text it sent."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        code = str(detail.get("code", "error"))
        message = str(detail.get("message", ""))
        fields = detail.get("fields")
    else:
        code, message, fields = "http_error", str(body)[:500] or response.reason_phrase, None
    status = response.status_code
    kind = _BY_STATUS.get(status, ServiceUnavailable if status >= 500 else APIError)
    return kind(
        status,
        code,
        message,
        fields=fields if isinstance(fields, list) else None,
        body=body,
        retry_after=retry_after_seconds(response),
    )
