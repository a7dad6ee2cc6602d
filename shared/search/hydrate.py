"""Hydrate: every hit read back from Postgres, the source of truth. A hit Postgres does not
hold at its live version is dropped, counted and named in ``Candidates.stale`` (the service
queues its purge once the response is made: this stage only reads), so the read path never
serves stale or deleted text."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shared.search.caps import cap_per_document, within_cap
from shared.search.values import (
    NOTHING_READ_AHEAD,
    Candidate,
    Candidates,
    Query,
    ReadAhead,
    Retrieved,
)
from shared.stores.ports import VectorSearch
from shared.stores.schemas import document_of_chunk
from shared.vector_type import vector_from_bytes

EMPTY_SCORES: Mapping[str, float] = {}
# Results hydrated with their embeddings: more than a default token budget packs; the policy
# reads the rest's only if it gets to them (reading all 100 of a 100-result search cost 1 ms).
EMBEDDINGS_UP_FRONT = 24


def hydrate_page(
    query: Query, vectors: VectorSearch, retrieved: Retrieved, *, offset: int
) -> Candidates:
    """The candidates of the page that starts at ``offset`` in the fused ranking, in slices
    until the page can be filled: twice top_k (room for stale drops) or the rerank window at
    first, more only while a per-document cap leaves fewer than top_k results, and never past
    ``search_candidate_window`` candidates or ``search_hydrate_budget_ms`` (a cap of one per
    document over a corpus of few documents would otherwise hydrate every fused candidate)."""
    request, settings = query.request, query.settings
    fused = retrieved.fused[offset:]
    cosines = {hit.chunk_id: hit.score for hit in retrieved.arms.get("dense", [])}
    deadline = time.monotonic() + settings.search_hydrate_budget_ms / 1000
    step = max(request.top_k * 2, request.rerank.window if request.rerank.enabled else 0, 20)
    # Without rerank or MMR reordering them, the results are (unless some are stale) the first
    # top_k fused chunks within the per-document cap. Chunk ids name their document
    # (invariant: chunk ids are "<document id>:<ordinal>"), so the cap applies before
    # hydration. The first of them come with their embeddings, which the policy compares
    # while its token budget lasts (1,024 tokens: about 8 SciFact results).
    likely: list[str] = []
    if not request.rerank.enabled and request.mmr is None:
        likely = within_cap([cid for cid, _ in fused], request.per_document_cap, document_of_chunk)
        likely = likely[: request.top_k]
    read = functools.partial(
        hydrate,
        query,
        vectors,
        vector=retrieved.vector,
        embeddings_for=likely[:EMBEDDINGS_UP_FRONT],
        cosines=cosines,
        read_ahead=retrieved.read_ahead,
    )
    page = Candidates([])
    hydrated: set[str] = set()
    if likely:
        # Those alone, first: when all of them are live they are the results, and nothing
        # past them needs its text read (a 100-result search read 200 rows before).
        hydrated = set(likely)
        page = read([hit for hit in fused if hit[0] in hydrated])
        if len(page.items) == len(likely):  # none stale: nothing else can be a result
            return page
    for start in range(0, len(fused), step):
        more = read([hit for hit in fused[start : start + step] if hit[0] not in hydrated])
        page.items += more.items
        page.dropped += more.dropped
        page.stale += more.stale
        capped = cap_per_document(page.items, request.per_document_cap)
        if request.per_document_cap is None or len(capped) >= request.top_k:
            break
        if len(page.items) >= settings.search_candidate_window or time.monotonic() > deadline:
            break
    if hydrated:  # back in the fused order
        position = {cid: i for i, (cid, _) in enumerate(fused)}
        page.items.sort(key=lambda c: position[c.chunk_id])
    return page


def hydrate(
    query: Query,
    vectors: VectorSearch,
    fused: list[tuple[str, float]],
    *,
    vector: list[float],
    embeddings_for: list[str],
    cosines: Mapping[str, float] = EMPTY_SCORES,
    read_ahead: ReadAhead = NOTHING_READ_AHEAD,
) -> Candidates:
    """The live chunks among one slice of the fused list, as candidates: those
    ``read_ahead`` holds from its rows, the others read now.

    ``cosines``: the dense arm's, by chunk id."""
    ids = [cid for cid, _ in fused]
    unread = [cid for cid in ids if cid not in read_ahead.ids]
    live = {cid: read_ahead.rows[cid] for cid in ids if cid in read_ahead.rows}
    if unread:
        # Postgres computes a cosine only when some hit lacks one (a hit of the lexical arm
        # alone).
        known = all(cid in cosines for cid in unread)
        live |= vectors.hydrate(query.tenant_id, unread, None if known else vector, embeddings_for)
    candidates = []
    for cid in ids:
        row = live.get(cid)
        if row is None:
            continue
        candidates.append(
            Candidate(
                chunk_id=cid,
                document_id=str(row.document_id),
                external_id=row.external_id,
                title=row.title,
                version=row.version,
                section=row.section,
                char_start=row.char_start,
                char_end=row.char_end,
                indexed_at=row.updated_at.isoformat(),
                text=row.text,
                token_count=row.token_count,
                # The rest are loaded for the candidates that need them (with_embeddings).
                embedding=(None if row.embedding is None else vector_from_bytes(row.embedding)),
                scores={"dense_cosine": round(_cosine(cid, row, cosines), 6)},
                flags=list(row.flags),
                first_sentence_tokens=row.first_sentence_tokens,
                whole_document=bool(row.whole_document),
            )
        )
    stale = [cid for cid in ids if cid not in live]
    return Candidates(candidates, len(stale), stale)


def _cosine(chunk_id: str, row: Any, cosines: Mapping[str, float]) -> float:
    """The dense arm's cosine of the chunk, else the one Postgres computed as it read it."""
    return cosines[chunk_id] if chunk_id in cosines else float(row.cosine)


def with_embeddings(
    query: Query, vectors: VectorSearch, candidates: list[Candidate]
) -> list[Candidate]:
    """The candidates, those hydrated without an embedding as copies with the one Postgres
    holds (in one read)."""
    missing = [c.chunk_id for c in candidates if c.embedding is None]
    if not missing:
        return candidates
    found = vectors.embeddings(query.tenant_id, missing)
    return [
        replace(c, embedding=found[c.chunk_id])
        if c.embedding is None and c.chunk_id in found
        else c
        for c in candidates
    ]
