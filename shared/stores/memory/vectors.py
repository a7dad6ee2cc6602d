"""The vector store in memory: chunks, their unit vectors, and each document's live version
(what the documents table says), in dictionaries."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from shared.models import Chunk, Document
from shared.stores.buckets import bucket_of, bucket_sums, fingerprint
from shared.stores.filters import Filters, passes
from shared.stores.schemas import (
    BucketStats,
    Fingerprints,
    VersionChunks,
)
from shared.vector_type import PackedVector


@dataclass
class _Row:
    """One chunk as the vector store holds it (the columns hydration reads by name)."""

    id: str
    tenant_id: str
    document_id: uuid.UUID
    version: int
    ordinal: int
    text: str
    text_hash: str
    char_start: int
    char_end: int
    section: str
    title: str
    token_count: int
    flags: list[str]
    first_sentence_tokens: int | None
    metadata: dict[str, Any]
    embedding: np.ndarray
    fingerprint: int
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_chunk(self) -> Chunk:
        return Chunk(
            id=self.id, tenant_id=self.tenant_id, document_id=self.document_id,
            version=self.version, ordinal=self.ordinal, text=self.text,
            text_hash=self.text_hash, char_start=self.char_start, char_end=self.char_end,
            section=self.section, title=self.title, token_count=self.token_count,
            bucket=bucket_of(self.id), fingerprint=self.fingerprint, metadata_=self.metadata,
            flags=self.flags, first_sentence_tokens=self.first_sentence_tokens,
        )  # fmt: skip


@dataclass
class _Live:
    """A document's live version, as the documents table says it."""

    tenant_id: str
    external_id: str
    version: int


class MemoryVectorStore:
    """Chunks, their vectors, and each document's live version, in dictionaries."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}
        self.documents: dict[uuid.UUID, _Live] = {}

    # -- writes

    def upsert(self, versions: Sequence[VersionChunks]) -> None:
        for v in versions:
            live = self.documents.get(v.document_id)
            if live is None or live.version <= v.version:
                self.documents[v.document_id] = _Live(v.tenant_id, v.external_id, v.version)
            for r in v.rows:
                held = self.rows.get(r.id)
                if held is not None and held.version > v.version:
                    continue  # an older version never replaces a newer one
                vector = np.asarray(r.embedding, dtype=np.float32)
                self.rows[r.id] = _Row(
                    id=r.id, tenant_id=v.tenant_id, document_id=v.document_id,
                    version=v.version, ordinal=r.ordinal, text=r.text, text_hash=r.text_hash,
                    char_start=r.char_start, char_end=r.char_end, section=r.section,
                    title=v.title, token_count=r.token_count, flags=list(r.flags),
                    first_sentence_tokens=r.first_sentence_tokens, metadata=dict(v.metadata),
                    embedding=vector / (np.linalg.norm(vector) or 1.0),
                    fingerprint=fingerprint(
                        chunk_id=r.id, tenant_id=v.tenant_id, document_id=str(v.document_id),
                        external_id=v.external_id, version=v.version, ordinal=r.ordinal,
                        text_hash=r.text_hash, title=v.title, section=r.section,
                        metadata=v.metadata,
                    ),
                )  # fmt: skip

    def delete_superseded(
        self, live_versions: dict[uuid.UUID, int], chunk_counts: dict[uuid.UUID, int] | None = None
    ) -> dict[uuid.UUID, list[str]]:
        """Each document's live version recorded (a tombstone's too), and its chunks older
        than it (or past its chunk count) removed."""
        removed: dict[uuid.UUID, list[str]] = {}
        for document_id, version in live_versions.items():
            live = self.documents.get(document_id)
            if live is not None:
                live.version = max(live.version, version)
            count = (chunk_counts or {}).get(document_id)
            gone = [
                row.id
                for row in self.rows.values()
                if row.document_id == document_id
                and (row.version < version or (count is not None and row.ordinal >= count))
            ]
            for chunk_id in gone:
                del self.rows[chunk_id]
            if gone:
                removed[document_id] = sorted(gone)
        return removed

    # -- search and hydration

    def nearest(
        self,
        tenant_id: str,
        vector: list[float],
        size: int,
        filters: Filters | None = None,
        *,
        within_s: float | None = None,
    ) -> list[tuple[str, float]]:
        query = _unit(vector)
        scored = [
            (row.id, float(row.embedding @ query))
            for row in self._of_tenant(tenant_id)
            if passes(filters, row.metadata, str(row.document_id))
        ]
        return sorted(scored, key=lambda hit: (-hit[1], hit[0]))[:size]

    def hydrate(
        self,
        tenant_id: str,
        ids: Sequence[str],
        vector: list[float] | None,
        embeddings_for: Sequence[str] = (),
    ) -> dict[str, Any]:
        query = None if vector is None else _unit(vector)
        wanted_embeddings = set(embeddings_for)
        found: dict[str, Any] = {}
        for chunk_id in ids:
            row = self.rows.get(chunk_id)
            if row is None or row.tenant_id != tenant_id or not self._is_live(row):
                continue
            live = self.documents[row.document_id]
            found[chunk_id] = replace_fields(
                row,
                external_id=live.external_id,
                whole_document=row.ordinal == 0 and not self._has_second(row),
                cosine=None if query is None else float(row.embedding @ query),
                embedding=(
                    PackedVector(row.embedding).data if chunk_id in wanted_embeddings else None
                ),
            )
        return found

    def embeddings(self, tenant_id: str, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {r.id: r.embedding for r in self._among(tenant_id, ids)}

    def metadata_values(self, tenant_id: str, ids: Sequence[str], key: str) -> dict[str, Any]:
        return {r.id: r.metadata[key] for r in self._among(tenant_id, ids) if key in r.metadata}

    def document_chunks(
        self, tenant_id: str, document_id: uuid.UUID, section: str | None = None
    ) -> Sequence[Chunk]:
        rows = [
            r
            for r in self._of_tenant(tenant_id)
            if r.document_id == document_id
            and self._is_live(r)
            and (section is None or r.section == section)
        ]
        return [r.as_chunk() for r in sorted(rows, key=lambda r: r.ordinal)]

    # -- reads by id and counts

    def chunks_by_ids(self, ids: Sequence[str]) -> dict[str, Chunk]:
        return {cid: self.rows[cid].as_chunk() for cid in ids if cid in self.rows}

    def count_of_tenant(self, tenant_id: str | None, /) -> int:
        return sum(1 for r in self.rows.values() if tenant_id in (None, r.tenant_id))

    def count_of_document(self, document_id: uuid.UUID) -> int:
        return sum(1 for r in self.rows.values() if r.document_id == document_id)

    def counts_by_tenant(self) -> dict[str, int]:
        return dict(Counter(r.tenant_id for r in self.rows.values()))

    def sample_texts(self, tenant_id: str, size: int, seed: float = 0.0) -> list[str]:
        rows = sorted(self._of_tenant(tenant_id), key=lambda r: r.id)
        picked = np.random.default_rng(int(seed * 2**31)).permutation(len(rows))[:size]
        return [rows[i].text for i in picked]

    # -- reconciliation

    def tenants(self) -> set[str]:
        return {r.tenant_id for r in self.rows.values()}

    def bucket_stats(self, tenant_id: str) -> BucketStats:
        return bucket_sums((r.id, r.version, r.fingerprint) for r in self._of_tenant(tenant_id))

    def fingerprints_in_buckets(self, tenant_id: str, buckets: Sequence[int], /) -> Fingerprints:
        wanted = set(buckets)
        return {
            r.id: (r.version, r.fingerprint)
            for r in self._of_tenant(tenant_id)
            if bucket_of(r.id) in wanted
        }

    def fingerprints_by_ids(self, tenant_id: str, ids: Sequence[str]) -> Fingerprints:
        return {r.id: (r.version, r.fingerprint) for r in self._among(tenant_id, ids)}

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        return {cid: self.rows[cid].tenant_id for cid in ids if cid in self.rows}

    # -- reindex

    def count_up_to(self, last_id: str, tenant_id: str | None = None) -> int:
        return sum(
            1 for r in self.rows.values() if r.id <= last_id and tenant_id in (None, r.tenant_id)
        )

    def page_after(
        self, last_id: str, size: int, tenant_id: str | None = None
    ) -> list[tuple[Chunk, Document]]:
        rows = sorted(
            (r for r in self.rows.values() if r.id > last_id and tenant_id in (None, r.tenant_id)),
            key=lambda r: r.id,
        )[:size]
        return [(r.as_chunk(), self._document(r)) for r in rows]

    # -- helpers

    def _document(self, row: _Row) -> Document:
        live = self.documents[row.document_id]
        return Document(id=row.document_id, tenant_id=row.tenant_id, external_id=live.external_id)

    def _of_tenant(self, tenant_id: str) -> list[_Row]:
        return [r for r in self.rows.values() if r.tenant_id == tenant_id]

    def _among(self, tenant_id: str, ids: Sequence[str]) -> list[_Row]:
        rows = (self.rows.get(cid) for cid in ids)
        return [r for r in rows if r is not None and r.tenant_id == tenant_id]

    def _is_live(self, row: _Row) -> bool:
        live = self.documents.get(row.document_id)
        return live is not None and live.version == row.version

    def _has_second(self, row: _Row) -> bool:
        second = self.rows.get(f"{row.document_id}:1")
        return second is not None and second.version == row.version


def replace_fields(row: _Row, **extra: Any) -> Any:
    """A hydrated row: the chunk's columns and the joined ones, read by attribute name."""
    return _Hydrated(**{**vars(row), **extra})


class _Hydrated:
    def __init__(self, **columns: Any) -> None:
        self.__dict__.update(columns)


def _unit(vector: Sequence[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    return v / (np.linalg.norm(v) or 1.0)
