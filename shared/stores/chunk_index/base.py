"""What every role of the chunk index shares: the client, the settings, the live layout (which
index a tenant's copies are in), index creation, and reading copies back."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from elasticsearch import ApiError, BadRequestError, Elasticsearch, NotFoundError, helpers

from shared.settings import Settings, get_settings
from shared.stores.buckets import fingerprint_of_source
from shared.stores.elastic import get_es, raises_store_errors
from shared.stores.es_index import (
    REINDEX_TENANT,
    Layout,
    anchor_index,
    ensure_index,
    index_body,
    live_layout,
    parse_index_name,
    reindex_in_progress,
    tenant_alias,
    tenant_index,
)
from shared.stores.schemas import (
    EsCopy,
    IndexUnavailable,
    TenantLines,
)

log = logging.getLogger(__name__)

# Fields read back from a copy: what its fingerprint covers, and the stored fingerprint.
COPIED_FIELDS = [
    "tenant_id",
    "document_id",
    "external_id",
    "version",
    "ordinal",
    "text_hash",
    "title",
    "section",
    "metadata",
    "fingerprint",
]
REINDEX_PROGRESS = "reindex_last_id"  # in the target generation's anchor's _meta
# How long a process trusts what it read of the live layout: a reindex's switch is seen
# within this (the relay's writes to a tenant's alias are right either side of it).
LAYOUT_TTL_S = 2.0


# Per process: the indices known to exist (tenant aliases and concrete indices), and the
# layout last read, with when it was read.
_existing: set[str] = set()
_layout: dict[str, tuple[float, Layout]] = {}
# Per process: the settings each generation's indices are made under (its anchor's shape; a
# generation's shape never changes, a discarded one's name is never used again).
_generation_settings: dict[tuple[str, str], Settings] = {}
# Per process: the tenant each generation being built rebuilds, None for every tenant (fixed
# when the generation starts, like its shape).
_generation_tenant: dict[tuple[str, str], str | None] = {}

# What of a generation's shape its anchor records, as the settings name them.
GENERATION_SHAPE = ("es_shards", "es_replicas", "lexical_analysis", "es_text_analyzer")


def _shape_of(anchor: dict[str, Any]) -> dict[str, Any]:
    """What of GENERATION_SHAPE an anchor (as ``indices.get`` describes it) was made with."""
    made = anchor["settings"]["index"]
    shape: dict[str, Any] = {
        "es_shards": int(made["number_of_shards"]),
        "es_replicas": int(made["number_of_replicas"]),
    }
    # An anchor made before indices recorded their analysis says nothing of it: its
    # generation's indices are made under the creating process's.
    analysis = anchor["mappings"].get("_meta", {}).get("lexical_analysis")
    if analysis is not None:
        shape["lexical_analysis"] = analysis
    analyzer = anchor["mappings"].get("properties", {}).get("text", {}).get("analyzer")
    if analyzer is not None:
        shape["es_text_analyzer"] = analyzer
    return shape


@raises_store_errors
class IndexBase:
    """The Elasticsearch client and settings every role works with, and where a tenant's copies
    are."""

    def __init__(self, es: Elasticsearch | None = None, settings: Settings | None = None) -> None:
        self._es = es
        self.settings = settings or get_settings()
        self.alias = self.settings.es_chunks_alias()  # the read alias over every live index

    @property
    def es(self) -> Elasticsearch:
        """The client given, or the process's (looked up at each use: a composition root
        makes one adapter for the process's life, and the client may be made again)."""
        return self._es or get_es()

    def layout(self, fresh: bool = False) -> Layout:
        """The live layout, as read at most ``LAYOUT_TTL_S`` ago (``fresh``: read now)."""
        read_at, layout = _layout.get(self.alias, (0.0, Layout(None, None)))
        if fresh or time.monotonic() - read_at > LAYOUT_TTL_S:
            layout = live_layout(self.es, self.settings)
            _layout[self.alias] = (time.monotonic(), layout)
        return layout

    def forget(self, tenant_id: str) -> None:
        """Check the tenant's index again before its next write (it answered 404)."""
        _existing.discard(tenant_alias(self.settings, tenant_id))

    def per_tenant(self) -> bool:
        """Whether each tenant has an index of its own (False on the shared layout)."""
        return self.layout().per_tenant

    def _target(self, tenant_id: str) -> str:
        """Where the tenant's copies are read and written: its alias, or on the shared
        layout the one index every tenant shares."""
        layout = self.layout()
        return tenant_alias(self.settings, tenant_id) if layout.per_tenant else self.alias

    def _ensure_tenant_index(self, tenant_id: str) -> None:
        alias = tenant_alias(self.settings, tenant_id)
        if alias in _existing:
            return
        if not self.es.indices.exists_alias(name=alias):
            generation = self.layout().generation or ensure_index(self.settings, self.es)
            self._create(
                tenant_index(self.settings, generation, tenant_id),
                {alias: {"is_write_index": True}, self.alias: {}},
            )
        _existing.add(alias)

    def _ensure_generation_index(self, generation: str, tenant_id: str) -> str:
        """The tenant's index in a generation being built (no aliases until the switch),
        made as the generation's anchor says whichever process makes it: the reindex's own
        copy or a relay's dual write, configured otherwise. Returns its name."""
        name = tenant_index(self.settings, generation, tenant_id)
        if name not in _existing:
            self._create(name, {}, self._generation_made_under(generation))
            _existing.add(name)
        return name

    def _generation_made_under(self, generation: str) -> Settings:
        """This process's settings with the generation's shape (shards, replicas, lexical
        analysis, text analyzer) as its anchor records it: what the process that started it
        configured."""
        key = (self.alias, generation)
        if key not in _generation_settings:
            shape = _shape_of(self._anchor(generation))
            _generation_settings[key] = self.settings.model_copy(update=shape)
        return _generation_settings[key]

    def _generation_tenant(self, generation: str) -> str | None:
        """The one tenant ``generation`` rebuilds (its anchor's ``_meta`` says), or None when
        it rebuilds every tenant."""
        key = (self.alias, generation)
        if key not in _generation_tenant:
            meta = self._anchor(generation)["mappings"].get("_meta", {})
            _generation_tenant[key] = meta.get(REINDEX_TENANT)
        return _generation_tenant[key]

    def _anchor(self, generation: str) -> dict[str, Any]:
        """The generation's anchor index as Elasticsearch describes it: settings and mappings
        (its shape, and in ``_meta`` the reindex's progress)."""
        anchor = anchor_index(self.settings, generation)
        return dict(self.es.indices.get(index=anchor)[anchor])

    def _create(
        self,
        name: str,
        aliases: dict[str, Any],
        made_under: Settings | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        body = index_body(made_under or self.settings)
        if meta:  # made with the index: no index is ever seen without it
            body["mappings"]["_meta"] = {**body["mappings"]["_meta"], **meta}
        try:
            self.es.indices.create(
                index=name, settings=body["settings"], mappings=body["mappings"], aliases=aliases
            )
            log.info("created chunk index %s", name)
        except BadRequestError as e:
            if e.error == "resource_already_exists_exception":
                return  # another process created it first
            raise IndexUnavailable(e.meta.status, f"{e.error}: {e.message}") from e
        except ApiError as e:
            raise IndexUnavailable(e.meta.status, f"{e.error}: {e.message}") from e

    def _addressed(self, requests: Sequence[TenantLines], where: Any) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for tenant_id, row_lines in requests:
            index = where(tenant_id)
            for line in row_lines:
                op = next(iter(line)) if len(line) == 1 else None
                if op in ("index", "delete", "create", "update"):
                    line = {op: {**line[op], "_index": index}}
                lines.append(line)
        return lines

    def _count(self, index: str, query: dict[str, Any] | None) -> int:
        try:
            return int(self.es.count(index=index, query=query)["count"])
        except NotFoundError:  # a tenant with no index yet
            return 0

    def _scan(self, index: str, query: dict[str, Any]) -> dict[str, EsCopy]:
        hits = helpers.scan(
            self.es,
            index=index,
            query={"query": query, "version": True},
            _source=COPIED_FIELDS,
            size=2000,
        )
        copies: dict[str, EsCopy] = {}
        for h in hits:
            copy = self._copy(h)
            held = copies.get(h["_id"])
            if held is None or copy.index_tenant != copy.tenant_id:
                copies[h["_id"]] = copy
        return copies

    def _copy(self, hit: dict[str, Any]) -> EsCopy:
        parsed = parse_index_name(self.settings, hit["_index"])
        return EsCopy(
            tenant_id=hit["_source"].get("tenant_id", ""),
            version=int(hit["_source"].get("version", 0)),
            stored_fingerprint=int(hit["_source"].get("fingerprint", -1)),
            fields_fingerprint=fingerprint_of_source(hit["_id"], hit["_source"]),
            es_version=int(hit.get("_version", 0)),
            index_tenant=parsed.tenant_id if parsed else None,
        )

    def reindex_target(self) -> str | None:
        """The generation a reindex in progress is building, if any (the tenant it rebuilds
        remembered for ``bulk_to``)."""
        running = reindex_in_progress(self.es, self.settings)
        if running is None:
            return None
        _generation_tenant[(self.alias, running.generation)] = running.tenant_id
        return running.generation
