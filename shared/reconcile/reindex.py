"""Rebuild the Elasticsearch index from Postgres behind the alias, then switch atomically.

1. A new concrete index is created and marked with the ``<alias>-reindexing`` alias; from then
   on the relay writes every change to it as well as to the live index (dual write).
2. Chunks are copied from Postgres in id order, a page at a time, with external versions (a
   newer dual-written copy wins). After each page the last id copied is stored in the new
   index's ``_meta``, so an interrupted reindex resumes where it stopped.
3. The live alias moves to the new index in one ``update_aliases`` call; the old index is
   deleted. Searches use the live alias throughout and never see a half-built index.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elasticsearch import Elasticsearch, helpers

from shared.db import unit_of_work
from shared.reconcile import repository as repo
from shared.settings import get_settings
from shared.stores.chunk_document import es_document
from shared.stores.elastic import get_es
from shared.stores.es_index import (
    concrete_index_name,
    index_body,
    reindex_target,
    reindexing_alias,
)

PAGE = 1000


@dataclass
class ReindexResult:
    old_indices: list[str]
    new_index: str
    copied: int
    resumed: bool
    seconds: float


def reindex(
    progress: Callable[[int, int], None] | None = None, page_size: int = PAGE
) -> ReindexResult:
    settings = get_settings()
    es = get_es()
    alias = settings.es_chunks_alias()
    started = time.monotonic()
    target = reindex_target(es, settings)
    resumed = target is not None
    if target is None:
        target = f"{concrete_index_name(settings)}-r{int(time.time())}"
        es.indices.create(index=target, **index_body(settings))
        es.indices.put_alias(index=target, name=reindexing_alias(settings))
    meta = _meta(es, target)
    last_id = str(meta.get("reindex_last_id", ""))
    with unit_of_work() as uow:
        total = repo.chunk_count(uow.session)
        done = repo.chunk_count_up_to(uow.session, last_id) if last_id else 0
    while True:
        with unit_of_work() as uow:
            page = repo.chunks_after(uow.session, last_id, page_size)
        if not page:
            break
        helpers.bulk(
            es,
            (_action(target, chunk, doc) for chunk, doc in page),
            raise_on_error=False,
            chunk_size=PAGE,
        )
        last_id = page[-1][0].id
        es.indices.put_mapping(index=target, meta={**meta, "reindex_last_id": last_id})
        done += len(page)
        if progress:
            progress(done, total)
    es.indices.refresh(index=target)
    old = list(es.indices.get_alias(name=alias))
    es.indices.update_aliases(
        actions=[
            *({"remove": {"index": index, "alias": alias}} for index in old),
            {"add": {"index": target, "alias": alias, "is_write_index": True}},
            {"remove": {"index": target, "alias": reindexing_alias(settings)}},
        ]
    )
    for index in old:
        es.indices.delete(index=index)
    return ReindexResult(old, target, done, resumed, time.monotonic() - started)


def _meta(es: Elasticsearch, index: str) -> dict[str, Any]:
    mapping = es.indices.get_mapping(index=index)[index]["mappings"]
    return dict(mapping.get("_meta", {}))


def _action(index: str, chunk: Any, doc: Any) -> dict[str, Any]:

    return {
        "_index": index,
        "_id": chunk.id,
        "version": chunk.version,
        "version_type": "external",
        "_source": es_document(chunk, doc),
    }
