"""Diversify: the same text met twice shown once, maximal marginal relevance over a window of
the candidates, and the per-document cap of the results."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from shared.search.caps import cap_per_document
from shared.search.values import Candidate, Query

# Two candidates of different documents, one of which holds at least this share of the
# other's word trigrams, are the same text again: the same page as Markdown and as HTML, cut
# into chunks of other sizes, one with lines ("Added in: v9.0.0") the other lacks. Of the
# Node.js path page's 59 Markdown chunks, 49 are so held by an HTML chunk, each by one of its
# own section; among the development set's other documents only a licence shipped twice
# (the same bytes) and two flag descriptions npm's pages repeat word for word reach it.
# Short texts (under 8 trigrams) only ever count as copies when they are the same.
NEAR_COPY_CONTAINMENT = 0.85
NEAR_COPY_MIN_TRIGRAMS = 8
_WORD = re.compile(r"\w+")


def collapse_copies(candidates: list[Candidate]) -> list[Candidate]:
    """The first of the candidates with the same text stands for all of them, naming the
    others' documents in ``copies``: the same text whitespace aside (a page shipped under two
    names, a licence as COPYING and as LICENSE), or a later candidate of another document
    of which one holds nearly all of the other's text (the same page in two formats, cut
    into chunks of other sizes). One result with both provenances, not two; the first keeps
    its place and its text."""
    first: dict[str, Candidate] = {}
    kept: list[_Shingled] = []
    found: dict[str, list[Candidate]] = {}  # a kept candidate's chunk id -> its copies met
    for c in candidates:
        key = hashlib.blake2b(" ".join(c.text.split()).encode(), digest_size=16).hexdigest()
        original = first.get(key)
        if original is None:
            shingled = _Shingled(c)
            original = _holder_of(shingled, kept)
            if original is None:
                first[key] = c
                kept.append(shingled)
                continue
        found.setdefault(original.chunk_id, []).append(c)
    return [
        replace(k.candidate, copies=[*k.candidate.copies, *found[k.candidate.chunk_id]])
        if k.candidate.chunk_id in found
        else k.candidate
        for k in kept
    ]


class _Shingled:
    """A candidate's word trigrams (hashed), and eight of them to try first: one of two texts
    holding 0.85 of the other's has at least one of the held text's eight but for a chance
    of 0.15^8, and most pairs have none (a search compares about 150)."""

    def __init__(self, candidate: Candidate) -> None:
        words = _WORD.findall(candidate.text.lower())
        self.candidate = candidate
        self.trigrams = set(map(hash, zip(words, words[1:], words[2:], strict=False)))
        self.sample = list(itertools.islice(self.trigrams, 8))

    def holds(self, other: _Shingled) -> bool:
        """Whether this text holds 0.85 or more of ``other``'s trigrams."""
        return (
            len(other.trigrams) >= NEAR_COPY_MIN_TRIGRAMS
            and any(g in self.trigrams for g in other.sample)
            and len(other.trigrams & self.trigrams) >= NEAR_COPY_CONTAINMENT * len(other.trigrams)
        )


def _holder_of(candidate: _Shingled, kept: list[_Shingled]) -> Candidate | None:
    """The first kept candidate of another document that holds nearly all of
    ``candidate``'s text, or nearly all of whose text ``candidate`` holds."""
    document = candidate.candidate.document_id
    for other in kept:
        if other.candidate.document_id != document and (
            other.holds(candidate) or candidate.holds(other)
        ):
            return other.candidate
    return None


# A result of fewer words than this (with a letter or digit) is a crumb: a "SEE ALSO" line, a
# two-line code fragment, a rule of dashes. No answer is said in so few words, so crumbs go
# after the other results of the page, whatever the format that made them. A document short
# enough to be one such chunk is not a crumb: it is all there is to say.
CRUMB_WORDS = 8
_WORDISH = re.compile(r"\S*\w\S*")


def crumbs_last(candidates: list[Candidate]) -> list[Candidate]:
    """``candidates`` with the crumbs (pieces of longer documents, of fewer than
    ``CRUMB_WORDS`` words) after the rest, each part in its order."""

    def is_crumb(c: Candidate) -> bool:
        return not c.whole_document and len(_WORDISH.findall(c.text, 0, 400)) < CRUMB_WORDS

    crumbs = [c for c in candidates if is_crumb(c)]
    if not crumbs:
        return candidates
    return [c for c in candidates if c not in crumbs] + crumbs


def mmr(
    candidates: list[Candidate], lambda_: float, wanted: int, *, cap: int | None
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


def diversify(
    query: Query,
    candidates: list[Candidate],
    load_embeddings: Callable[[list[Candidate]], list[Candidate]],
) -> tuple[list[Candidate], list[Candidate]]:
    """The candidates in their final order (MMR within a window of the best ones when the
    request asks for it) and the page's results: the first top_k within the per-document
    cap. ``load_embeddings`` gives the window's candidates with the embeddings MMR compares."""
    request = query.request
    if request.mmr is not None:
        window = load_embeddings(candidates[: query.settings.search_candidate_window])
        candidates = mmr(window, request.mmr.lambda_, request.top_k, cap=request.per_document_cap)
    return candidates, cap_per_document(candidates, request.per_document_cap)[: request.top_k]
