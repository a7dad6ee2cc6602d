"""Elasticsearch client (one per process, created on first use)."""

from __future__ import annotations

from functools import lru_cache

from elasticsearch import Elasticsearch

from shared.settings import get_settings


@lru_cache
def get_es() -> Elasticsearch:
    settings = get_settings()
    return Elasticsearch(
        settings.es_url(),
        request_timeout=settings.es_request_timeout_s,
        max_retries=0,
        retry_on_timeout=False,
    )
