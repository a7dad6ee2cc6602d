"""Elasticsearch client (one per process, created on first use)."""

from __future__ import annotations

from functools import lru_cache

from elasticsearch import Elasticsearch

from shared.settings import get_settings


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
