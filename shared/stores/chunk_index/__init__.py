"""The chunk index (Elasticsearch: an index per tenant behind aliases, shared/stores/es_index.py),
as the rest of Concord uses it:

* writes: versioned bulk requests with a result per item (the relay), each line sent to its
  tenant's index (created at the tenant's first write), the same lines to a reindex in
  progress, and whether a copy exists;
* lexical search (BM25) within one tenant, in that tenant's own index, so its scores come from
  its own documents only: the match query and the tenant filter are built here, from the query
  text and the request's filters, so no caller can search another tenant's copies or put user
  text into anything but a ``multi_match``;
* reads for reconciliation: which tenants it holds, per-bucket sums of each tenant's copies,
  and the copies with their fingerprints recomputed from their fields;
* reindex: the next generation of indices built beside the live one (every tenant's, or one
  tenant's index), its progress and scope stored in its anchor's ``_meta``, and the atomic
  switch of the aliases;
* counts and the cluster's health.

Every request for chunks goes to Elasticsearch through this class; the contract it keeps is
tested in tests/stores/test_contract.py against the real store, with the same tests as the
vector store. Its methods raise Concord's store errors (StoreUnavailable: no answer, 429, 5xx;
StoreRejected: any other refusal; shared/stores/elastic.store_error), never the client's, which
callers that degrade or retry catch; a tenant with no index yet reads as empty. A copy's shape is
shared/stores/chunk_document.py.

On the shared layout of older deployments (one index for every tenant) the same calls work on
that index, with the tenant filter, until ``concord reindex`` moves it to an index per tenant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from shared.stores.chunk_index.audit import IndexAuditing, IndexHealthChecks
from shared.stores.chunk_index.base import _layout
from shared.stores.chunk_index.lexical import IndexLexicalSearch, _found_analysis
from shared.stores.chunk_index.reindex import (
    IndexReindexing,
    ReindexCopyRefused,
    ReindexOfAnotherScope,
)
from shared.stores.chunk_index.writes import IndexWrites
from shared.stores.ports import ChunkWriter, IndexAudit, IndexHealth, IndexReindex, LexicalSearch

__all__ = [
    "ChunkIndex",
    "ElasticsearchChunkIndex",
    "ReindexCopyRefused",
    "ReindexOfAnotherScope",
    "_found_analysis",
    "_layout",
]


class ChunkIndex(ChunkWriter, LexicalSearch, IndexAudit, IndexReindex, IndexHealth, Protocol):
    """Every port of the chunk index (shared/stores/ports.py). Consumers take the narrowest
    port they use."""


class ElasticsearchChunkIndex(
    IndexWrites, IndexLexicalSearch, IndexAuditing, IndexHealthChecks, IndexReindexing
):
    """Every role of the chunk index in one adapter, as the composition root makes it
    (shared/stores/compose.py); each role is a class of its own module of this package."""


if TYPE_CHECKING:  # mypy proves the adapter implements every port
    _implements: ChunkIndex = ElasticsearchChunkIndex()
