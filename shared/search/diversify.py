"""Diversify: the same text met twice shown once, maximal marginal relevance over a window of
the candidates, and the per-document cap of the results."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from shared.search.policy import Candidate
from shared.search.values import Query

T = TypeVar("T")


def collapse_copies(candidates: list[Candidate]) -> list[Candidate]:
    """The first of the candidates with the same text (whitespace aside) stands for all of
    them, naming the others' documents in ``copies``: a page shipped under two names (a
    licence as COPYING and as LICENSE) is one result with both provenances, not two."""
    first: dict[str, Candidate] = {}
    kept = []
    for c in candidates:
        key = hashlib.blake2b(" ".join(c.text.split()).encode(), digest_size=16).hexdigest()
        original = first.setdefault(key, c)
        if original is c:
            kept.append(c)
        else:
            original.copies.append(c)
    return kept


def mmr(
    candidates: list[Candidate], lambda_: float, wanted: int, cap: int | None
) -> list[Candidate]:
    """Maximal marginal relevance over the candidates' own embeddings: picks until ``wanted``
    results within the per-document ``cap``, then the rest in their order. Each pick updates
    every candidate's redundancy with one matrix-vector product, so the cost is
    O(wanted x candidates x dimensions), not cubic in the candidates."""
    usable = [c for c in candidates if c.embedding is not None]
    if not usable:
        return candidates
    vectors = np.stack([np.asarray(c.embedding, dtype=np.float32) for c in usable])
    relevance = np.array(
        [c.scores.get("rerank", c.scores["dense_cosine"]) for c in usable], dtype=np.float32
    )
    # The highest similarity to any chosen candidate (0 before the first pick, as in the
    # textbook definition; negative similarities count as they are after it).
    redundancy = np.full(len(usable), -np.inf, dtype=np.float32)
    open_ = np.ones(len(usable), dtype=bool)
    per_document: dict[str, int] = {}
    chosen: list[Candidate] = []
    kept = 0
    while open_.any() and kept < wanted:
        penalty = redundancy if chosen else np.zeros_like(redundancy)
        value = np.where(open_, lambda_ * relevance - (1 - lambda_) * penalty, -np.inf)
        best = int(np.argmax(value))
        open_[best] = False
        candidate = usable[best]
        chosen.append(candidate)
        redundancy = np.maximum(redundancy, vectors @ vectors[best])
        per_document[candidate.document_id] = per_document.get(candidate.document_id, 0) + 1
        kept += cap is None or per_document[candidate.document_id] <= cap
    return chosen + [c for c, still_open in zip(usable, open_, strict=True) if still_open]


def cap_per_document(candidates: list[Candidate], cap: int | None) -> list[Candidate]:
    return within_cap(candidates, cap, lambda c: c.document_id)


def within_cap(items: list[T], cap: int | None, document_of: Callable[[T], str]) -> list[T]:
    """``items`` in order, keeping at most ``cap`` per document (all of them if cap is None)."""
    if cap is None:
        return items
    seen: dict[str, int] = {}
    kept = []
    for item in items:
        document = document_of(item)
        seen[document] = seen.get(document, 0) + 1
        if seen[document] <= cap:
            kept.append(item)
    return kept


def diversify(
    query: Query,
    candidates: list[Candidate],
    load_embeddings: Callable[[list[Candidate]], None],
) -> tuple[list[Candidate], list[Candidate]]:
    """The candidates in their final order (MMR within a window of the best ones when the
    request asks for it) and the page's results: the first top_k within the per-document
    cap. ``load_embeddings`` reads the window's embeddings MMR compares."""
    request = query.request
    if request.mmr is not None:
        window = candidates[: query.settings.search_candidate_window]
        load_embeddings(window)
        candidates = mmr(window, request.mmr.lambda_, request.top_k, request.per_document_cap)
    return candidates, cap_per_document(candidates, request.per_document_cap)[: request.top_k]
