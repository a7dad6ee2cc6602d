"""Elasticsearch client (one per process, created on first use), and its errors in Concord's
terms: what the store adapters raise instead of the driver's (shared/errors.StoreError)."""

from __future__ import annotations

from functools import lru_cache

from elasticsearch import ApiError, Elasticsearch, TransportError

from shared.errors import StoreConflict, StoreError, StoreRejected, StoreUnavailable
from shared.settings import get_settings
from shared.stores.driver_errors import translating

STORE = "Elasticsearch"


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
    are StoreUnavailable (retriable), 409 StoreConflict (a version conflict), any other
    answer StoreRejected; each keeps the status."""
    if isinstance(error, ApiError):
        status = error.meta.status
        kind: type[StoreError] = StoreRejected
        if status == 429 or status >= 500:
            kind = StoreUnavailable
        elif status == 409:
            kind = StoreConflict
        return kind(f"{STORE} answered {status}: {error.message}", store=STORE, status=status)
    return StoreUnavailable(f"{STORE} is unreachable: {type(error).__name__}", store=STORE)


# Every public method of an Elasticsearch adapter raises StoreError for the driver's errors.
raises_store_errors = translating((ApiError, TransportError), store_error)
