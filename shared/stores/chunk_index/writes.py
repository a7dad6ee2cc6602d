"""The relay's role: versioned bulk writes with a result per item, each line sent to its tenant's
index (made at the tenant's first write), the same lines to a reindex in progress."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from elasticsearch import NotFoundError

from shared.models import Chunk, Document
from shared.stores.chunk_document import es_document
from shared.stores.chunk_index.base import IndexBase
from shared.stores.elastic import raises_store_errors
from shared.stores.es_index import tenant_index
from shared.stores.schemas import (
    IndexUnavailable,
    TenantLines,
)


@raises_store_errors
class IndexWrites(IndexBase):
    """ChunkWriter (shared/stores/ports.py)."""

    def prepare(self, tenant_ids: Iterable[str]) -> dict[str, IndexUnavailable]:
        """Make sure each tenant has its live index (created with its alias at the tenant's
        first write); returns the tenants whose index could not be created, with why."""
        if not self.per_tenant():
            return {}
        failed: dict[str, IndexUnavailable] = {}
        for tenant_id in sorted(set(tenant_ids)):
            try:
                self._ensure_tenant_index(tenant_id)
            except IndexUnavailable as e:
                failed[tenant_id] = e
        return failed

    def bulk(self, requests: Sequence[TenantLines]) -> Any:
        """One bulk request of the rows' lines (action and document), each action sent to its
        tenant's live index; Elasticsearch's answer, with a result per item. ``prepare`` the
        tenants first. Raises what the client raises for a refused request."""
        if not self.layout().per_tenant:
            # The shared layout ends with a reindex's switch: writes check it, not a copy of
            # it cached by this process (the old alias takes no writes after the switch).
            self.layout(fresh=True)
        lines = self._addressed(requests, self._target)
        # require_alias: a write never makes Elasticsearch create an index of its own
        # (a tenant alias that went missing answers 404 for its rows instead).
        return self.es.bulk(operations=lines, refresh=False, require_alias=True)

    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]:
        """Each chunk's copy, at its Postgres version as an external version: the status of
        each item, in order (409 when the index holds that version or a newer one)."""
        requests: list[TenantLines] = []
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
            requests.append((chunk.tenant_id, [{"index": action}, es_document(chunk, doc)]))
        if not requests:
            return []
        failed = self.prepare(t for t, _ in requests)
        if failed:
            raise next(iter(failed.values()))
        items = self.bulk(requests)["items"]
        return [int(next(iter(item.values()))["status"]) for item in items]

    def bulk_to(self, generation: str, requests: Sequence[TenantLines]) -> Any:
        """The same lines to the tenants' indices of ``generation`` (a reindex's dual write);
        of a generation that rebuilds one tenant, that tenant's lines only."""
        rebuilt = self._generation_tenant(generation)
        if rebuilt is not None:
            requests = [(tenant, lines) for tenant, lines in requests if tenant == rebuilt]
        if not requests:
            return {"errors": False, "items": []}
        for tenant_id in {t for t, _ in requests}:
            self._ensure_generation_index(generation, tenant_id)
        lines = self._addressed(
            requests, lambda tenant: tenant_index(self.settings, generation, tenant)
        )
        return self.es.bulk(operations=lines, refresh=False)

    def exists(self, tenant_id: str, chunk_id: str) -> bool:
        try:
            return bool(self.es.exists(index=self._target(tenant_id), id=chunk_id))
        except NotFoundError:
            return False
