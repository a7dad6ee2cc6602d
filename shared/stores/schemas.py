"""The shapes both chunk stores exchange with the rest of Concord: a version's chunks as the
pipeline writes them, per-bucket sums and per-chunk fingerprints as reconciliation compares
them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared.errors import StoreError


@dataclass(frozen=True)
class ChunkText:
    """What a search reads of its first candidates to order them: a chunk's text, its
    section's heading path and its document's title."""

    text: str
    section: str
    title: str


def chunk_id(document_id: uuid.UUID, ordinal: int) -> str:
    """Chunk ids are deterministic, so a replay overwrites instead of duplicating."""
    return f"{document_id}:{ordinal}"


def document_of_chunk(chunk_id: str) -> str:
    """The document id a chunk id names (the inverse of :func:`chunk_id`)."""
    return chunk_id.rpartition(":")[0]


def document_id_of(chunk_id: str) -> uuid.UUID:
    """The document a chunk id (or any id that starts with a document's) names, as a UUID;
    the nil UUID for an id that names none."""
    try:
        return uuid.UUID(chunk_id.split(":", 1)[0])
    except ValueError:
        return uuid.UUID(int=0)


# bucket -> (chunks, sum of versions, sum of fingerprints)
BucketStats = dict[int, tuple[int, int, int]]
# chunk id -> (version, fingerprint)
Fingerprints = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class ArmHit:
    """One hit of a search arm (a store's nearest or best-matching chunks): its chunk, its
    rank in the arm (from 1) and the arm's own score (cosine, BM25)."""

    chunk_id: str
    rank: int
    score: float


@dataclass(frozen=True)
class ChunkRow:
    id: str
    ordinal: int
    text: str
    text_hash: str
    char_start: int
    char_end: int
    section: str
    token_count: int
    embedding: np.ndarray
    flags: list[str] = field(default_factory=list)  # e.g. doubtful_extraction (Postgres only)
    first_sentence_tokens: int | None = None  # Postgres only: see TextChunk


@dataclass(frozen=True)
class VersionChunks:
    """One document version's chunks, as the pipeline writes them."""

    tenant_id: str
    document_id: uuid.UUID
    version: int
    external_id: str
    title: str
    metadata: dict[str, Any]
    rows: Sequence[ChunkRow]


@dataclass
class EsCopy:
    """A chunk's copy in the chunk index, as reconciliation reads it."""

    tenant_id: str
    version: int
    stored_fingerprint: int  # the number the relay wrote
    fields_fingerprint: int  # recomputed from the copy's fields
    es_version: int
    # The tenant whose index holds the copy (None in the shared layout, where one index
    # holds every tenant's): a copy in another tenant's index is deleted from there.
    index_tenant: str | None = None


# (tenant id, the bulk lines of one outbox row): what the relay sends.
TenantLines = tuple[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class ReindexStart:
    generation: str  # the generation being built
    last_id: str  # the last chunk id copied into it ("" when nothing is yet)
    resumed: bool  # it was already being built
    # Why one that was being built was discarded instead of resumed (None when it was not).
    started_again_because: str | None = None


class IndexUnavailable(StoreError):
    """A tenant's index could not be created (e.g. the cluster's shard limit): the rows of
    that tenant get this as their item result, the others are sent. One of Concord's store
    errors, with Elasticsearch's status."""

    status_code = 503
    code = "index_unavailable"

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason, store="Elasticsearch", status=status)
