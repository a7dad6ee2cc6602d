"""Reindex: the next generation of indices built beside the live one (every tenant's, or one
tenant's index), its progress and scope stored in its anchor's ``_meta``, and the atomic switch
of the aliases."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from elasticsearch import ApiError, NotFoundError, helpers

from shared.errors import Conflict, StoreRejected
from shared.models import Chunk, Document
from shared.stores.chunk_document import es_document
from shared.stores.chunk_index.base import (
    GENERATION_SHAPE,
    REINDEX_PROGRESS,
    IndexBase,
    _existing,
    _layout,
    _shape_of,
)
from shared.stores.elastic import raises_store_errors
from shared.stores.es_index import (
    REINDEX_TENANT,
    anchor_index,
    chunks_prefix,
    new_generation,
    parse_index_name,
    reindexing_alias,
    tenant_alias,
)
from shared.stores.schemas import ReindexStart

log = logging.getLogger(__name__)

# A reindex page's copies that Elasticsearch answers 429 or 5xx are sent again this often.
COPY_ATTEMPTS = 4
COPY_BACKOFF_S = 1.0


class ReindexOfAnotherScope(Conflict):
    """A reindex of other tenants than asked for was interrupted and waits to be resumed:
    one generation is built at a time (the relay dual-writes to one), so it is finished
    first."""


class ReindexCopyRefused(StoreRejected):
    """Copies of a reindex page that Elasticsearch would not take: the reindex stops before
    its progress passes them (and so before switching to a generation missing them)."""


def _refused_copies(errors: Any) -> dict[str, int]:
    """chunk id -> status of each failed copy, but a version conflict: a dual write put a
    newer version there first, which is what the reindex wants."""
    refused = {}
    for error in errors:
        item = next(iter(error.values()))
        status = int(item.get("status", 500))
        if status != 409:
            refused[str(item.get("_id"))] = status
    return refused


@raises_store_errors
class IndexReindexing(IndexBase):
    """IndexReindex (shared/stores/ports.py)."""

    def start_reindex(self, tenant_id: str | None = None) -> ReindexStart:
        """The generation a reindex in progress is building, or a new one marked as being
        built (from then on the relay dual-writes to it), with the last chunk id copied into
        it. Leftovers of an earlier run are deleted first: chunk indices behind no alias (a
        switch that stopped before it deleted the old indices) and the half-built index of a
        shared-layout reindex.

        With ``tenant_id`` the generation rebuilds that tenant's index only (its anchor
        records the tenant; the relay dual-writes that tenant's changes only). That needs the
        per-tenant layout, and a generation in progress for other tenants (every tenant, or
        another one) is finished first: ReindexOfAnotherScope otherwise.

        A generation in progress whose anchor records another shape than this process is
        configured with (CONCORD_ES_SHARDS, CONCORD_ES_REPLICAS, CONCORD_LEXICAL_ANALYSIS or
        CONCORD_ES_TEXT_ANALYZER changed since it started) is discarded and a new one
        started: resumed, it would switch to indices unlike the configured ones. Only the
        copying done so far is lost; Postgres holds every chunk. The caller holds the
        reindex lock (shared/reconcile/reindex.py): no other run switches to the generation
        discarded here."""
        if tenant_id is not None and not self.layout(fresh=True).per_tenant:
            raise ReindexOfAnotherScope(
                "the chunk index is still in the shared layout (one index for every tenant); "
                "run `concord reindex` without --tenant once to give each tenant its own index"
            )
        generation = self.reindex_target()
        discarded = None
        if generation is not None:
            anchor = self._anchor(generation)
            building = anchor["mappings"].get("_meta", {}).get(REINDEX_TENANT)
            if building != tenant_id:
                raise ReindexOfAnotherScope(
                    f"an interrupted reindex of {_scope(building)} waits to be resumed; run "
                    f"`concord reindex{_scope_option(building)}` to finish it first"
                )
            differences = self._differences_from_configured(_shape_of(anchor))
            if not differences:
                self._delete_dead_indices(keep=generation)
                progress = str(anchor["mappings"].get("_meta", {}).get(REINDEX_PROGRESS, ""))
                return ReindexStart(generation, progress, resumed=True)
            discarded = f"generation {generation} was being built with {', '.join(differences)}"
            log.warning("reindex: %s; discarded, starting again", discarded)
        self._delete_dead_indices(keep=None)  # a discarded generation is behind no read alias
        generation = new_generation()
        self._create(
            anchor_index(self.settings, generation),
            {reindexing_alias(self.settings): {}},
            meta={REINDEX_TENANT: tenant_id} if tenant_id is not None else None,
        )
        return ReindexStart(generation, "", resumed=False, started_again_because=discarded)

    def _differences_from_configured(self, made: dict[str, Any]) -> list[str]:
        return [
            f"CONCORD_{name.upper()}={made[name]} (configured now: {getattr(self.settings, name)})"
            for name in GENERATION_SHAPE
            if name in made and made[name] != getattr(self.settings, name)
        ]

    def _delete_dead_indices(self, keep: str | None) -> list[str]:
        """Delete the chunk indices that nothing reads or writes: behind neither the read
        alias nor of the generation ``keep`` being built."""
        prefix = chunks_prefix(self.settings)
        try:
            every = self.es.indices.get_alias(index=f"{prefix}*")
        except NotFoundError:
            return []
        dead = []
        for index, held in every.items():
            parsed = parse_index_name(self.settings, index)
            if self.alias in held["aliases"] or (parsed and parsed.generation == keep):
                continue
            dead.append(index)
        for index in dead:
            self.es.indices.delete(index=index)
            _existing.discard(index)
            log.info("deleted chunk index %s: behind no alias", index)
        return dead

    def copy_to(self, generation: str, chunks: Iterable[tuple[Chunk, Document]]) -> None:
        """Copies of ``chunks`` into their tenants' indices of ``generation``, at their
        versions: one a dual write already put there at a newer version stays."""
        actions = []
        for chunk, doc in chunks:
            index = self._ensure_generation_index(generation, chunk.tenant_id)
            actions.append(
                {
                    "_index": index,
                    "_id": chunk.id,
                    "version": chunk.version,
                    "version_type": "external",
                    "_source": es_document(chunk, doc),
                }
            )
        for attempt in range(1, COPY_ATTEMPTS + 1):
            _, errors = helpers.bulk(self.es, actions, raise_on_error=False, chunk_size=1000)
            refused = _refused_copies(errors)
            if not refused:
                return
            busy = {i for i, status in refused.items() if status == 429 or status >= 500}
            if busy != refused.keys() or attempt == COPY_ATTEMPTS:
                example = next(iter(sorted(refused.items())))
                raise ReindexCopyRefused(
                    f"Elasticsearch refused {len(refused)} copies of this page (e.g. {example[0]}:"
                    f" {example[1]}); the generation is not switched to, a run resumes here",
                    store="Elasticsearch",
                )
            actions = [a for a in actions if a["_id"] in busy]
            time.sleep(COPY_BACKOFF_S * attempt)

    def mark_reindex_progress(self, generation: str, last_id: str) -> None:
        """Every chunk up to ``last_id`` is copied: an interrupted reindex resumes after it."""
        meta = {**self._anchor(generation)["mappings"].get("_meta", {}), REINDEX_PROGRESS: last_id}
        self.es.indices.put_mapping(index=anchor_index(self.settings, generation), meta=meta)

    def finish_reindex(self, generation: str) -> list[str]:
        """Switch to ``generation`` in one atomic ``update_aliases`` call (the read alias and
        every tenant's alias move to its indices; the dual writes end), then delete the
        indices of the generations before; returns their names. A tenant whose live index
        has no counterpart in ``generation`` (it holds no chunk now) gets an empty one, so
        no tenant's alias ever disappears. A tenant's first index, created in the old
        generation while this ran, makes the switch fail (Elasticsearch answers 400 or 500 for
        an alias with two write indices): it is computed again, once.

        A generation that rebuilds one tenant moves that tenant's aliases only; its anchor,
        which no alias reads, goes with the tenant's old index."""
        rebuilt = self._generation_tenant(generation)
        for attempt in (1, 2):
            try:
                old = (
                    self._switch_to(generation)
                    if rebuilt is None
                    else self._switch_tenant_to(generation, rebuilt)
                )
                break
            except ApiError:  # 400 or 500: a second write index for a tenant's alias
                if attempt == 2:
                    raise
        _layout.pop(self.alias, None)
        old += self._delete_dead_indices(keep=None)  # the old ones, and any late straggler
        return sorted(set(old))

    def _switch_to(self, generation: str) -> list[str]:
        prefix = chunks_prefix(self.settings)
        built = list(self.es.indices.get(index=f"{prefix}{generation}-*"))
        built_tenants = {
            parsed.tenant_id
            for name in built
            if (parsed := parse_index_name(self.settings, name)) and parsed.tenant_id
        }
        every = self.es.indices.get_alias(index=f"{prefix}*")
        live = {index: held for index, held in every.items() if self.alias in held["aliases"]}
        for name in live:
            parsed = parse_index_name(self.settings, name)
            if parsed and parsed.tenant_id and parsed.tenant_id not in built_tenants:
                built.append(self._ensure_generation_index(generation, parsed.tenant_id))
        self.es.indices.refresh(index=f"{prefix}{generation}-*")
        actions: list[dict[str, Any]] = [
            {"remove": {"index": index, "alias": name}}
            for index, held in live.items()
            for name in held["aliases"]
        ]
        for index in built:
            parsed = parse_index_name(self.settings, index)
            if parsed is None:
                continue
            actions.append({"add": {"index": index, "alias": self.alias}})
            if parsed.tenant_id:
                alias = tenant_alias(self.settings, parsed.tenant_id)
                actions.append({"add": {"index": index, "alias": alias, "is_write_index": True}})
        actions.append(
            {
                "remove": {
                    "index": anchor_index(self.settings, generation),
                    "alias": reindexing_alias(self.settings),
                }
            }
        )
        self.es.indices.update_aliases(actions=actions)
        return list(live)

    def _switch_tenant_to(self, generation: str, tenant_id: str) -> list[str]:
        alias = tenant_alias(self.settings, tenant_id)
        built = self._ensure_generation_index(generation, tenant_id)  # made even if empty
        try:
            live = list(self.es.indices.get_alias(name=alias))
        except NotFoundError:
            live = []  # the tenant had no index yet: it gets the rebuilt one
        self.es.indices.refresh(index=built)
        actions: list[dict[str, Any]] = [
            {"remove": {"index": index, "alias": name}}
            for index in live
            for name in (alias, self.alias)
        ]
        actions += [
            {"add": {"index": built, "alias": self.alias}},
            {"add": {"index": built, "alias": alias, "is_write_index": True}},
            {
                "remove": {
                    "index": anchor_index(self.settings, generation),
                    "alias": reindexing_alias(self.settings),
                }
            },
        ]
        self.es.indices.update_aliases(actions=actions)
        return live


def _scope(tenant_id: str | None) -> str:
    return "every tenant" if tenant_id is None else f"tenant {tenant_id}"


def _scope_option(tenant_id: str | None) -> str:
    return "" if tenant_id is None else f" --tenant {tenant_id}"
