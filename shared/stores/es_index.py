"""The versioned Elasticsearch index behind an alias, created by an idempotent setup step.

Bump ``SCHEMA_VERSION`` whenever the mapping changes: a new concrete index is created and the
alias moves to it (rebuilt from Postgres, the source of truth).
"""

from __future__ import annotations

from typing import Any

from elasticsearch import Elasticsearch, NotFoundError

from shared.settings import Settings
from shared.stores.elastic import get_es

SCHEMA_VERSION = 1


# Settings that older versions of this code set and that are now left to Elasticsearch's
# default; ensure_index resets them (None) on existing indices.
RESET_SETTINGS: dict[str, Any] = {
    # Elasticsearch's default is a refresh each second, but set explicitly (even to that), a
    # shard refreshes every second while nobody searches it, which during bulk ingest took
    # about half of Elasticsearch's CPU (bench/ingest: 9.6-14.8 CPU-s against 4.4-6.8 per
    # 1,000 documents). Left unset, a shard not searched for 30 s skips these refreshes, and
    # the next search refreshes it first and waits, so it sees every acknowledged write.
    "refresh_interval": None,
}


def index_body(settings: Settings) -> dict[str, Any]:
    text = {"type": "text", "analyzer": settings.es_text_analyzer}
    # Terms already analyzed in Python (shared/stores/english_analysis.py): split on spaces only.
    stemmed = {"type": "text", "analyzer": "whitespace"}
    return {
        "settings": {
            "number_of_shards": 1,
            "number_of_replicas": 0,
        },
        "mappings": {
            "dynamic": "strict",
            "_meta": {"concord_schema_version": SCHEMA_VERSION},
            # metadata_num and metadata_date held range-searchable copies of metadata, one
            # field per key, until shared/search/filters.range_terms replaced them (a mapping
            # keeps its fields; nothing writes them now).
            "dynamic_templates": [
                {"numbers": {"path_match": "metadata_num.*", "mapping": {"type": "double"}}},
                {
                    "dates": {
                        "path_match": "metadata_date.*",
                        "mapping": {"type": "date", "format": "strict_date_optional_time"},
                    }
                },
            ],
            "properties": {
                "chunk_id": {"type": "keyword"},
                "tenant_id": {"type": "keyword"},
                "document_id": {"type": "keyword"},
                "external_id": {"type": "keyword"},
                "version": {"type": "integer"},
                "ordinal": {"type": "integer"},
                "text_hash": {"type": "keyword"},
                "title": text,
                "section": text,
                "text": text,
                "stemmed": {"properties": {"title": stemmed, "section": stemmed, "text": stemmed}},
                "metadata": {"type": "flattened"},
                "metadata_ranges": {"type": "keyword"},
                "metadata_num": {"type": "object", "dynamic": True},
                "bucket": {"type": "integer"},
                "hash_num": {"type": "long"},  # unused since 0008; a mapping keeps its fields
                "fingerprint": {"type": "long"},
                "metadata_date": {"type": "object", "dynamic": True},
            },
        },
    }


def concrete_index_name(settings: Settings, version: int = SCHEMA_VERSION) -> str:
    return f"{settings.es_chunks_alias()}-v{version}"


def ensure_index(settings: Settings, es: Elasticsearch | None = None) -> str:
    """Create the concrete index and its alias if there is none; otherwise add any new fields
    to the index the alias points at (which may be a reindexed ``...-r<time>`` index) and
    reset the settings now left to their defaults."""
    es = es or get_es()
    alias = settings.es_chunks_alias()
    try:
        current = list(es.indices.get_alias(name=alias))
    except NotFoundError:
        current = []
    mappings = index_body(settings)["mappings"]
    if current:
        for index in current:
            es.indices.put_settings(index=index, settings={"index": RESET_SETTINGS})
            es.indices.put_mapping(
                index=index,
                properties=mappings["properties"],
                dynamic_templates=mappings["dynamic_templates"],
            )
        return current[0]
    index = concrete_index_name(settings)
    if not es.indices.exists(index=index):
        es.indices.create(index=index, **index_body(settings))
    es.indices.update_aliases(
        actions=[{"add": {"index": index, "alias": alias, "is_write_index": True}}]
    )
    return index


def reindexing_alias(settings: Settings) -> str:
    return f"{settings.es_chunks_alias()}-reindexing"


def reindex_target(es: Elasticsearch, settings: Settings) -> str | None:
    """The index a reindex in progress is building (the relay dual-writes to it)."""
    try:
        return next(iter(es.indices.get_alias(name=reindexing_alias(settings))), None)
    except NotFoundError:
        return None
