"""The Elasticsearch layout: an index per tenant, behind aliases, created by idempotent setup.

BM25 scores a document with statistics of the shard it lives in (document frequencies, the
average field length), whatever filter the query has. In one index shared by every tenant,
one tenant's uploads would move another's scores and rankings (and let it learn what the
other holds). So each tenant's copies live in an index of its own, with one primary shard:
its lexical scores are a function of its own documents only.

Names (``<p>`` is ``CONCORD_ES_INDEX_PREFIX``):

* ``<p>-chunks-<generation>-t-<tenant>``: a tenant's concrete index, created at its first
  write. A generation (``g<milliseconds>``) is one build of the layout: a reindex builds
  the next generation beside the live one and switches to it.
* ``<p>-chunks-t-<tenant>``: the tenant's alias (its write index): searches and writes use it.
* ``<p>-chunks``: the read alias over every live index (per-tenant counts, reconciliation's
  lookups by id, the list of tenants).
* ``<p>-chunks-<generation>-anchor``: an empty index that keeps the read alias in existence
  and names the live generation; ``<p>-chunks-reindexing`` marks the anchor of a generation
  being built (the relay writes every change there too).
* an index template for ``<p>-chunks-*``: any chunk index gets Concord's mapping, even one
  Elasticsearch would create on its own.

A deployment from before this layout has one concrete index (``<p>-chunks-v1``, or a reindexed
``...-r<time>``) behind the read alias: the *shared* layout. Everything still works on it
(searches filter by tenant, as they did); ``concord reindex`` moves it, online, to an index per
tenant (shared/reconcile/reindex.py).

Existing indices keep the mapping they were made with: setup only adds the fields they lack
(Elasticsearch refuses to change most parameters of a field), and only ``concord reindex``
builds them again. Each index's ``_meta`` records, for operators, the ``SCHEMA_VERSION`` and
the lexical analysis it was made under; bump the version when a change reaches existing
indices only through a reindex. The text fields' indexing follows ``CONCORD_LEXICAL_ANALYSIS``
(``_mappings_for``); after it changes, a search of an older index uses the fields that index
has (shared/stores/chunk_index/lexical.py, ``lexical_search``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
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


def index_settings(settings: Settings) -> dict[str, Any]:
    # One primary shard by default: a tenant's BM25 statistics are then those of all its
    # documents (with more, the lexical search pools them first: dfs_query_then_fetch).
    return {"number_of_shards": settings.es_shards, "number_of_replicas": settings.es_replicas}


def index_body(settings: Settings) -> dict[str, Any]:
    return {"settings": index_settings(settings), "mappings": _mappings_for(settings)}


def _mappings_for(settings: Settings) -> dict[str, Any]:
    # BM25 searches one family of text fields, the one CONCORD_LEXICAL_ANALYSIS names; the other
    # stays in _source (every field does) but is not indexed, and neither keeps positions (BM25
    # reads term frequencies and norms; no query of Concord's matches phrases). Indexing both
    # families with positions cost Elasticsearch about twice the CPU per bulk request, on the
    # cores the encoder uses (figures: README, "Search"). A changed analysis therefore takes
    # effect on existing indices through `concord reindex` (until then their lexical search
    # falls back to the analysis they were made under); indices made before this change index
    # both families.
    searched = settings.lexical_analysis
    text = {
        "type": "text",
        "analyzer": settings.es_text_analyzer,
        "index": searched == "elasticsearch",
        "index_options": "freqs",
    }
    # Terms already analyzed in Python (shared/stores/english_analysis.py): split on spaces only.
    stemmed = {
        "type": "text",
        "analyzer": "whitespace",
        "index": searched == "python-english",
        "index_options": "freqs",
    }
    return {
        "dynamic": "strict",
        "_meta": {"concord_schema_version": SCHEMA_VERSION, "lexical_analysis": searched},
        # metadata_num and metadata_date held range-searchable copies of metadata, one
        # field per key, until shared/stores/filters.range_terms replaced them (a mapping
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
    }


# ------------------------------------------------------------------ names


def chunks_prefix(settings: Settings) -> str:
    return f"{settings.es_chunks_alias()}-"


def tenant_alias(settings: Settings, tenant_id: str) -> str:
    return f"{chunks_prefix(settings)}t-{tenant_id}"


def tenant_index(settings: Settings, generation: str, tenant_id: str) -> str:
    return f"{chunks_prefix(settings)}{generation}-t-{tenant_id}"


def anchor_index(settings: Settings, generation: str) -> str:
    return f"{chunks_prefix(settings)}{generation}-anchor"


def reindexing_alias(settings: Settings) -> str:
    return f"{settings.es_chunks_alias()}-reindexing"


def new_generation() -> str:
    return f"g{int(time.time() * 1000)}"


@dataclass(frozen=True)
class IndexName:
    """What a chunk index's name says: its generation, and its tenant (None for an anchor);
    a name of neither shape (the shared layout's single index) parses to None."""

    generation: str
    tenant_id: str | None


def parse_index_name(settings: Settings, name: str) -> IndexName | None:
    rest = name.removeprefix(chunks_prefix(settings))
    if rest == name or not rest.startswith("g"):
        return None
    generation, _, kind = rest.partition("-")
    if kind == "anchor":
        return IndexName(generation, None)
    if kind.startswith("t-") and len(kind) > 2:
        return IndexName(generation, kind[2:])
    return None


# ------------------------------------------------------------------ the layout


@dataclass(frozen=True)
class Layout:
    """The live layout: the generation of per-tenant indices, or the shared layout's single
    index (``shared_index``) from before them."""

    generation: str | None
    shared_index: str | None

    @property
    def per_tenant(self) -> bool:
        return self.shared_index is None


def live_layout(es: Elasticsearch, settings: Settings) -> Layout:
    """The live layout, from the anchor behind the read alias (one small request however
    many tenants there are); without one, the read alias's own index is the shared layout's."""
    alias = settings.es_chunks_alias()
    try:
        anchors = list(
            es.indices.get_alias(index=f"{chunks_prefix(settings)}g*-anchor", name=alias)
        )
    except NotFoundError:
        anchors = []
    generations = [
        parsed.generation for name in anchors if (parsed := parse_index_name(settings, name))
    ]
    if generations:
        return Layout(max(generations), None)
    try:
        live = list(es.indices.get_alias(name=alias))
    except NotFoundError:
        return Layout(None, None)
    shared = next((index for index in live if parse_index_name(settings, index) is None), None)
    return Layout(None, shared)


def ensure_index(settings: Settings, es: Elasticsearch | None = None) -> str:
    """Idempotent setup: the index template, and the live generation's anchor behind the read
    alias (a fresh install starts a generation); on an existing layout, any new fields on
    every live index, and the settings now left to their defaults reset. Returns the live
    generation (or, on the shared layout, its index)."""
    es = es or get_es()
    body = index_body(settings)
    es.indices.put_index_template(
        name=settings.es_chunks_alias(),
        index_patterns=[f"{chunks_prefix(settings)}*"],
        template={"settings": body["settings"], "mappings": body["mappings"]},
        priority=100,
    )
    layout = live_layout(es, settings)
    if layout.generation is None and layout.shared_index is None:
        generation = new_generation()
        es.indices.create(
            index=anchor_index(settings, generation),
            settings=body["settings"],
            mappings=body["mappings"],
            aliases={settings.es_chunks_alias(): {}},
        )
        return generation
    alias = settings.es_chunks_alias()
    es.indices.put_settings(index=alias, settings={"index": RESET_SETTINGS})  # one request
    _add_new_fields(es, alias, body["mappings"])
    return layout.shared_index or str(layout.generation)


# Characters of index names per put_mapping request: they travel in its URL, and
# Elasticsearch refuses a request line over 4 kB (http.max_initial_line_length).
NAMES_PER_REQUEST_CHARS = 3000


def _add_new_fields(es: Elasticsearch, alias: str, mappings: dict[str, Any]) -> None:
    """Put on each live index the fields of ``mappings`` it lacks, and only those: a field
    it has keeps the parameters it was made with (Elasticsearch refuses to change most of
    them, ``index`` among them), until a reindex builds it again. Indices that lack the same
    fields share a request: none in the usual case, one (the alias) when a release adds a
    field."""
    live = es.indices.get_mapping(index=alias)
    lacking: dict[str, tuple[dict[str, Any], list[str]]] = {}  # by the fields, as JSON
    for name, found in live.items():
        have = found["mappings"]
        new = {
            "properties": _absent(mappings["properties"], have.get("properties", {})),
            "dynamic_templates": (
                mappings["dynamic_templates"]
                if have.get("dynamic_templates") != mappings["dynamic_templates"]
                else None
            ),
        }
        if new["properties"] or new["dynamic_templates"]:
            lacking.setdefault(json.dumps(new, sort_keys=True), (new, []))[1].append(name)
    for new, names in lacking.values():
        targets = [alias] if len(names) == len(live) else _joined_within(names)
        for target in targets:
            es.indices.put_mapping(
                index=target,
                properties=new["properties"] or None,
                dynamic_templates=new["dynamic_templates"],
            )


def _joined_within(names: list[str], limit: int = NAMES_PER_REQUEST_CHARS) -> list[str]:
    """``names`` joined by commas, in as few parts as keep each within ``limit`` characters."""
    parts: list[str] = []
    for name in names:
        if parts and len(parts[-1]) + 1 + len(name) <= limit:
            parts[-1] += "," + name
        else:
            parts.append(name)
    return parts


def _absent(wanted: dict[str, Any], have: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``wanted`` missing from ``have`` (an object's missing sub-fields too)."""
    absent: dict[str, Any] = {}
    for field, spec in wanted.items():
        if field not in have:
            absent[field] = spec
        elif "properties" in spec:
            inner = _absent(spec["properties"], have[field].get("properties", {}))
            if inner:
                absent[field] = {**spec, "properties": inner}
    return absent


# The key of a generation's anchor ``_meta`` that names the one tenant it rebuilds (absent: it
# rebuilds every tenant).
REINDEX_TENANT = "reindex_tenant"


@dataclass(frozen=True)
class ReindexInProgress:
    generation: str  # the generation being built (the relay dual-writes to it)
    tenant_id: str | None  # the one tenant it rebuilds, or None for every tenant


def reindex_in_progress(es: Elasticsearch, settings: Settings) -> ReindexInProgress | None:
    """The reindex in progress, read with its anchor in one request: the tenant it rebuilds
    is known from the same answer (a dual write made after the switch deleted the anchor
    still goes to that tenant's new index alone)."""
    try:
        marked = es.indices.get(index=reindexing_alias(settings))
    except NotFoundError:
        return None
    found = []
    for name, described in marked.items():
        parsed = parse_index_name(settings, name)
        # (An index of the shared layout's own reindex, from before, is no generation:
        # ignored, and removed when a reindex starts.)
        if parsed is not None and parsed.tenant_id is None:
            meta = described["mappings"].get("_meta", {})
            found.append(ReindexInProgress(parsed.generation, meta.get(REINDEX_TENANT)))
    return max(found, key=lambda r: r.generation) if found else None


def reindex_target(es: Elasticsearch, settings: Settings) -> str | None:
    """The generation a reindex in progress is building (the relay dual-writes to it)."""
    running = reindex_in_progress(es, settings)
    return running.generation if running else None
