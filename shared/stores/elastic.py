"""Elasticsearch client (one per process, created on first use), and its errors in Concord's
terms: what the store adapters raise instead of the driver's (shared/errors.StoreError)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import ParamSpec, TypeVar

from elasticsearch import ApiError, Elasticsearch, TransportError

from shared.errors import StoreError, StoreRejected, StoreUnavailable
from shared.settings import get_settings

STORE = "Elasticsearch"
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@lru_cache
def get_es() -> Elasticsearch:
    settings = get_settings()
    hosts = settings.es_hosts()
    return Elasticsearch(
        hosts,
        request_timeout=settings.es_request_timeout_s,
        # One node: an unreachable node fails the request at once (the caller degrades or
        # retries it). A cluster: a request that cannot reach one node is sent to another
        # (the transport marks the node dead for a while), as many times as there are others;
        # a timeout is not retried, the node may still be doing the work.
        max_retries=len(hosts) - 1,
        retry_on_timeout=False,
    )


def store_error(error: ApiError | TransportError) -> StoreError:
    """The driver's error as Concord's: no answer (refused, reset, timed out) and 429 or 5xx
    are StoreUnavailable (retriable), any other answer StoreRejected; both keep the status."""
    if isinstance(error, ApiError):
        status = error.meta.status
        kind = StoreUnavailable if status == 429 or status >= 500 else StoreRejected
        return kind(f"{STORE} answered {status}: {error.message}", store=STORE, status=status)
    return StoreUnavailable(f"{STORE} is unreachable: {type(error).__name__}", store=STORE)


def raises_store_errors(cls: type[T]) -> type[T]:
    """Every public method of the adapter ``cls`` raises StoreError where the driver raised
    its own error (the method's own handling of a driver error, a 404 read as empty, comes
    first)."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _translating(member))
    return cls


def _translating(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (ApiError, TransportError) as e:
            raise store_error(e) from e

    return call
