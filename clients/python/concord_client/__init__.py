"""A typed client of Concord's HTTP API: ``Concord`` (sync) and ``AsyncConcord`` (async), the
request and response models generated from the server's OpenAPI document (``models``), and
the errors they raise. Framework retrievers are in ``concord_client.langchain`` and
``concord_client.llamaindex`` (extras ``[langchain]`` and ``[llamaindex]``)."""

from concord_client._calls import RetryPolicy
from concord_client.async_client import AsyncConcord
from concord_client.client import Concord
from concord_client.errors import (
    APIError,
    AuthenticationError,
    BadRequest,
    ConcordError,
    Conflict,
    JobFailed,
    JobTimeout,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)

__all__ = [
    "APIError",
    "AsyncConcord",
    "AuthenticationError",
    "BadRequest",
    "Concord",
    "ConcordError",
    "Conflict",
    "JobFailed",
    "JobTimeout",
    "NotFound",
    "PermissionDenied",
    "RateLimited",
    "RetryPolicy",
    "ServiceUnavailable",
]
