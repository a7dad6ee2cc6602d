"""Purges of the stale copies a search met: queued for the relay at a version that can only
remove what is stale (never the live write still in the outbox), and each at most once a
minute whatever the request rate."""

from __future__ import annotations

import functools
import logging
from typing import Any

from redis.exceptions import RedisError

from shared.db import UnitOfWork
from shared.documents import repository as documents_repo
from shared.models import OutboxOp
from shared.outbox import repository as repo
from shared.redis_client import redis_client
from shared.settings import Settings
from shared.stores.compose import Stores
from shared.stores.schemas import document_id_of

log = logging.getLogger(__name__)


def queue_stale_copy_purges(
    stores: Stores, uow: UnitOfWork, settings: Settings, tenant_id: str, stale_ids: list[str]
) -> None:
    """Queue the Elasticsearch delete of hits Postgres does not hold live (a search met them).

    A stale copy is older than the document's version V (a copy at V would be live), so the
    delete is a purge at V - 1 (``external_gte``: it removes copies up to V - 1), never at V:
    V's own index write, which may still be in the outbox (a re-upload right after a
    delete), then always wins over the cleanup. A deleted document's tombstone version is
    never written, so its copies are purged at V itself."""
    by_doc: dict[Any, list[str]] = {}
    for cid in stale_ids:
        doc_id = document_id_of(cid)
        if doc_id.int:
            by_doc.setdefault(doc_id, []).append(cid)
    session = uow.session
    docs = documents_repo.documents_by_ids(session, list(by_doc))
    store = stores.vectors(session)
    for doc_id, cids in by_doc.items():
        doc = docs.get(doc_id)
        if doc is None or doc.tenant_id != tenant_id:
            continue
        live = store.chunks_by_ids(cids)
        version = doc.version if doc.deleted else doc.version - 1
        orphans = [c for c in cids if c not in live or doc.deleted]
        keys = _not_queued_lately(settings, [_purge_key(tenant_id, c, version) for c in orphans])
        repo.add_outbox(
            session,
            tenant_id=tenant_id,
            document_id=doc_id,
            op=OutboxOp.PURGE,
            version=version,
            chunk_ids=[c for c, key in zip(orphans, keys, strict=True) if key is not None],
        )
        # Marked once the rows are committed: a purge rolled back is queued by the next
        # search that meets the copy.
        uow.after_commit(functools.partial(_mark_queued, settings, [k for k in keys if k]))


# A search that meets a stale copy queues its purge. Behind a relay backlog (a large ingest
# ahead of it in the outbox) a hot query meets the same copies with every request and would
# queue them again each time, growing the backlog it waits behind by its own request rate.
# Each (tenant, chunk, version) is queued at most once in this many seconds, whichever API
# process meets it; one queued again after that (or when Redis cannot say) is harmless: the
# relay's purge of a copy already gone is a no-op.
PURGE_QUEUED_TTL_S = 60


def _purge_key(tenant_id: str, chunk_id: str, version: int) -> str:
    return f"concord:purge-queued:{tenant_id}:{chunk_id}:{version}"


def _not_queued_lately(settings: Settings, keys: list[str]) -> list[str | None]:
    """Each key, or None where its purge was queued less than PURGE_QUEUED_TTL_S ago."""
    if not keys:
        return []
    try:
        with redis_client(settings.redis_socket_timeout_s).pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.exists(key)
            queued = pipe.execute()
    except RedisError:
        return list(keys)
    return [None if found else key for key, found in zip(keys, queued, strict=True)]


def _mark_queued(settings: Settings, keys: list[str]) -> None:
    if not keys:
        return
    try:
        with redis_client(settings.redis_socket_timeout_s).pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, 1, ex=PURGE_QUEUED_TTL_S)
            pipe.execute()
    except RedisError:
        log.warning("could not mark %d queued purges; a search may queue them again", len(keys))
