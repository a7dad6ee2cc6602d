"""The chunk index in memory: each tenant's copies (their Elasticsearch documents, built by
shared/stores/chunk_document.py), with external versions and the tombstones deletes leave, and
a BM25 arm over their pre-analyzed fields, scored as Elasticsearch scores them."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import Conflict
from shared.models import Chunk, Document
from shared.settings import Settings, get_settings
from shared.stores import english_analysis
from shared.stores.buckets import bucket_of, bucket_sums, fingerprint_of_source
from shared.stores.chunk_document import es_document
from shared.stores.filters import Filters, passes
from shared.stores.schemas import (
    BucketStats,
    EsCopy,
    Fingerprints,
    IndexUnavailable,
    ReindexStart,
    TenantLines,
)

BM25_K1, BM25_B = 1.2, 0.75  # Elasticsearch's defaults


@dataclass
class _Copy:
    source: dict[str, Any]
    es_version: int
    index_tenant: str


class MemoryChunkIndex:
    """Each tenant's copies (their Elasticsearch documents), with external versions and the
    tombstones deletes leave, and a BM25 arm over their pre-analyzed fields."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or get_settings()
        # the search's defaults, as the real index reads them from the settings
        self.field_boosts = dict(settings.lexical_field_boosts)
        self.tie_breaker = settings.lexical_tie_breaker
        self.copies: dict[tuple[str, str], _Copy] = {}  # (index tenant, chunk id)
        self.tombstones: dict[tuple[str, str], int] = {}
        self._generations = itertools.count(1)
        self._building: tuple[str, str | None, dict[tuple[str, str], _Copy]] | None = None

    # -- writes

    def bulk(self, requests: Sequence[TenantLines]) -> Any:
        return self._bulk_into(self.copies, requests)

    def bulk_to(self, generation: str, requests: Sequence[TenantLines]) -> Any:
        return self._bulk_into(self._generation(generation), requests)

    def _bulk_into(
        self, target: dict[tuple[str, str], _Copy], requests: Sequence[TenantLines]
    ) -> dict[str, Any]:
        """Elasticsearch's bulk answer: an item per action, ``errors`` when one failed."""
        items = [item for tenant, lines in requests for item in self._apply(target, tenant, lines)]
        failed = any(
            i[op]["status"] >= 300 and (op, i[op]["status"]) != ("delete", 404)
            for i in items
            for op in i
        )
        return {"errors": failed, "items": items}

    def write(self, chunks: Iterable[tuple[Chunk, Document]], version_type: str) -> list[int]:
        statuses = []
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
            [item] = self._apply(
                self.copies, chunk.tenant_id, [{"index": action}, es_document(chunk, doc)]
            )
            statuses.append(int(item["index"]["status"]))
        return statuses

    def prepare(self, tenant_ids: Iterable[str]) -> dict[str, IndexUnavailable]:
        return {}  # every tenant's "index" exists: a dictionary key

    def forget(self, tenant_id: str) -> None:
        return None  # nothing cached to check again

    def reindex_target(self) -> str | None:
        return None if self._building is None else self._building[0]

    def exists(self, tenant_id: str, chunk_id: str) -> bool:
        return (tenant_id, chunk_id) in self.copies

    def _apply(
        self, target: dict[tuple[str, str], _Copy], tenant_id: str, lines: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Bulk lines as Elasticsearch applies them with external versions: a write or delete
        at a version not above the copy's (or its tombstone's) is refused with 409
        (``external_gte``: not below it)."""
        items: list[dict[str, Any]] = []
        lines_left = iter(lines)
        for line in lines_left:
            [(op, action)] = line.items()
            key = (tenant_id, str(action["_id"]))
            version = int(action.get("version", 0))
            gte = action.get("version_type") == "external_gte"
            held = target.get(key)
            current = held.es_version if held is not None else self.tombstones.get(key)
            allowed = current is None or version > current or (gte and version >= current)
            if op == "index":
                source = next(lines_left)
                if not allowed:
                    items.append({"index": {"_id": key[1], "status": 409}})
                    continue
                target[key] = _Copy(dict(source), version, tenant_id)
                items.append({"index": {"_id": key[1], "status": 201 if held is None else 200}})
            else:  # delete
                if held is None:
                    self.tombstones[key] = max(version, current or 0)
                    items.append({"delete": {"_id": key[1], "status": 404}})
                elif not allowed:
                    items.append({"delete": {"_id": key[1], "status": 409}})
                else:
                    del target[key]
                    self.tombstones[key] = version
                    items.append({"delete": {"_id": key[1], "status": 200}})
        return items

    # -- the BM25 arm

    def lexical_search(
        self,
        tenant_id: str,
        text: str,
        filters: Filters | None,
        size: int,
        field_boosts: Mapping[Any, float] | None = None,
        tie_breaker: float | None = None,
    ) -> list[tuple[str, float]]:
        terms = english_analysis.analyze(text).split()
        if not terms:
            return []
        boosts = {str(k): v for k, v in (field_boosts or self.field_boosts).items()}
        tie = self.tie_breaker if tie_breaker is None else tie_breaker
        copies = self._of_tenant(tenant_id)
        fields = {name: [c.source["stemmed"][name].split() for c in copies] for name in boosts}
        per_field = {name: _bm25(terms, docs) for name, docs in fields.items()}
        hits = []
        for i, copy in enumerate(copies):
            scores = [boosts[name] * per_field[name][i] for name in boosts]
            best = max(scores)
            if best <= 0 or not passes(
                filters, copy.source["metadata"], copy.source["document_id"]
            ):
                continue
            hits.append((copy.source["chunk_id"], best + tie * (sum(scores) - best)))
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))[:size]

    def term_counts(self, tenant_id: str, terms: list[str]) -> tuple[int, dict[str, int]] | None:
        copies = self._of_tenant(tenant_id)
        held = [
            {t for name in self.field_boosts for t in c.source["stemmed"][name].split()}
            for c in copies
        ]
        return len(copies), {term: sum(1 for words in held if term in words) for term in terms}

    # -- audit

    def refresh(self, tenant_id: str | None = None) -> None:
        return None  # every write is visible at once

    def tenants(self) -> set[str]:
        return {tenant for tenant, _ in self.copies}

    def count_of_tenant(self, tenant_id: str | None, /) -> int:
        return sum(1 for tenant, _ in self.copies if tenant_id in (None, tenant))

    def count_of_document(
        self, tenant_id: str, document_id: str, version: int | None = None
    ) -> int:
        return sum(
            1
            for c in self._of_tenant(tenant_id)
            if c.source["document_id"] == document_id
            and version in (None, int(c.source["version"]))
        )

    def cluster_status(self, timeout_s: float) -> str:
        return "green"

    def bucket_stats(self, tenant: str) -> tuple[BucketStats, int]:
        copies = self._of_tenant(tenant)
        sums = bucket_sums(
            (c.source["chunk_id"], int(c.source["version"]), int(c.source["fingerprint"]))
            for c in copies
        )
        return sums, 0

    def fingerprints_in_buckets(self, tenant: str, buckets: list[int], /) -> Fingerprints:
        return {
            cid: (copy.version, copy.stored_fingerprint)
            for cid, copy in self.copies_in_buckets(tenant, buckets).items()
        }

    def copies_in_buckets(
        self, tenant: str, buckets: list[int], unbucketed: bool = False
    ) -> dict[str, EsCopy]:
        wanted = set(buckets)
        return {
            c.source["chunk_id"]: _es_copy(c)
            for c in self._of_tenant(tenant)
            if not unbucketed and bucket_of(c.source["chunk_id"]) in wanted
        }

    def copies_by_ids(self, ids: Iterable[str], page: int = 10_000) -> dict[str, EsCopy]:
        wanted = set(ids)
        return {cid: _es_copy(c) for (_, cid), c in self.copies.items() if cid in wanted}

    def foreign_copies(self, tenant: str) -> dict[str, EsCopy]:
        return {
            c.source["chunk_id"]: _es_copy(c)
            for c in self._of_tenant(tenant)
            if c.source["tenant_id"] != tenant
        }

    # -- reindex: the next generation of copies, built beside the live ones, then switched

    def per_tenant(self) -> bool:
        return True

    def start_reindex(self, tenant_id: str | None = None) -> ReindexStart:
        if self._building is not None:
            generation, scope, copies = self._building
            if scope != tenant_id:
                raise Conflict(f"a reindex of {scope or 'every tenant'} is under way")
            last = max((cid for _, cid in copies), default="")
            return ReindexStart(generation, last, resumed=True)
        generation = f"g{next(self._generations)}"
        self._building = (generation, tenant_id, {})
        return ReindexStart(generation, "", resumed=False)

    def copy_to(self, generation: str, chunks: Iterable[tuple[Chunk, Document]]) -> None:
        target = self._generation(generation)
        for chunk, doc in chunks:
            action = {"_id": chunk.id, "version": chunk.version, "version_type": "external_gte"}
            self._apply(target, chunk.tenant_id, [{"index": action}, es_document(chunk, doc)])

    def mark_reindex_progress(self, generation: str, last_id: str) -> None:
        self._generation(generation)  # progress is what the generation holds

    def finish_reindex(self, generation: str) -> list[str]:
        _, scope, built = self._building or ("", None, {})
        self._generation(generation)
        kept = {k: c for k, c in self.copies.items() if scope is not None and k[0] != scope}
        self.copies = {**kept, **built}
        self._building = None
        return [f"before-{generation}"]

    def _generation(self, generation: str) -> dict[tuple[str, str], _Copy]:
        if self._building is None or self._building[0] != generation:
            raise Conflict(f"no reindex is building generation {generation}")
        return self._building[2]

    def _of_tenant(self, tenant_id: str) -> list[_Copy]:
        return [c for (tenant, _), c in sorted(self.copies.items()) if tenant == tenant_id]


def _es_copy(copy: _Copy) -> EsCopy:
    source = copy.source
    return EsCopy(
        tenant_id=source.get("tenant_id", ""),
        version=int(source.get("version", 0)),
        stored_fingerprint=int(source.get("fingerprint", -1)),
        fields_fingerprint=fingerprint_of_source(source["chunk_id"], source),
        es_version=copy.es_version,
        index_tenant=copy.index_tenant,
    )


def _bm25(terms: list[str], docs: list[list[str]]) -> list[float]:
    """Each document's BM25 score for ``terms`` (a term asked twice counts twice), with
    Elasticsearch's idf and length normalization over these documents."""
    if not docs:
        return []
    average = sum(len(d) for d in docs) / len(docs) or 1.0
    counts = [Counter(d) for d in docs]
    held = Counter(t for c in counts for t in c)
    scores = []
    for words, tf in zip(docs, counts, strict=True):
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(words) / average)
        score = 0.0
        for term in terms:
            if tf[term]:
                idf = math.log(1 + (len(docs) - held[term] + 0.5) / (held[term] + 0.5))
                score += idf * tf[term] * (BM25_K1 + 1) / (tf[term] + norm)
        scores.append(score)
    return scores
