"""Titles: among the first candidates, a document whose title names what the question asks
about comes before one whose title does not.

A question that names its subject ("What exit status does *ls* return ...", "Is *libtasn1*
safe to use from multiple threads?") is often outranked by another document's chunk that
matches the rest of its words better: xargs' exit statuses, libffi's thread safety. Both
arms score a chunk by its own words, and the title every chunk of a document shares is one
field of three to BM25 and a few words of the text the encoder reads. So the first
``search_passage_window`` fused candidates (after the passages stage has ordered each
document's own) are ordered by the term of their place (the passages' curve: 1 first, 0.5 at
the tenth place) plus ``search_title_lift`` times their title's *share*: the weight (IDF in
the tenant's corpus) of the heaviest question term the title holds, over that of the
question's heaviest term the corpus holds. At the default 0.1 a title naming the question's
rarest term is worth the first place over the second; one naming only a common word of the
question ("file", "news"), a fraction of it.

Measured on the real-document dev set's tune half (the file holding the answer's MRR@10
0.945 → 0.949 at 0.1, 0.958 at 0.2, 0.963 at 0.5) and on SciFact's train split (hybrid
nDCG@10 0.7120 → 0.7107 at 0.1, 0.7113 at 0.2, far lower at 0.3 and above: a paper's title
is a sentence, and holds the claim's rare words without being what the claim is about).
0.2 was the choice on those; on SciFact's test split it cost lexical and hybrid search 0.01,
past the 0.005 the search must keep, so the default is 0.1. Variants tried and left out
(the title's share of the whole question's weight, a lift only where the chunk's own text
lacks the title's term, only short titles, only long documents, times the share of the
title's words the question holds) and both halves' figures are in
docs/evaluation-and-benchmarks.md, "Real documents".
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from shared.search.coverage import CorpusCounts
from shared.search.passages import Question, place_weight
from shared.stores.english_analysis import analyze_repeated
from shared.stores.schemas import ChunkText


def title_shares(
    question: Question, counts: CorpusCounts | None, texts: Mapping[str, ChunkText]
) -> dict[str, float]:
    """Chunk id -> the share of the question's heaviest term that the chunk's title holds
    (those whose title holds no question term are left out). A term the tenant's corpus
    holds nowhere is in no title, and outweighs every other (the casual "a *bunch* of
    threads"): the heaviest is of the terms the corpus holds."""
    counts = counts or CorpusCounts.unknown()
    heaviest = max(
        (w for stem, w in question.weights.items() if not counts.known or counts.holding.get(stem)),
        default=0.0,
    )
    if heaviest <= 0:
        return {}
    shares = {}
    for chunk_id, text in texts.items():
        terms = _title_terms(text.title)
        held = max((w for stem, w in question.weights.items() if stem in terms), default=0.0)
        if held > 0:
            shares[chunk_id] = held / heaviest
    return shares


@lru_cache(maxsize=4096)
def _title_terms(title: str) -> frozenset[str]:
    return frozenset(analyze_repeated(title).split())


def lift_titled_documents(
    fused: list[tuple[str, float]], shares: Mapping[str, float], *, window: int, lift: float
) -> list[tuple[str, float]]:
    """``fused`` with its first ``window`` candidates ordered by their place's term plus
    ``lift`` x their title's share (ties keep the fused order, so each document's chunks keep
    theirs); the rest as they were."""
    first = fused[:window]
    order = sorted(
        range(len(first)),
        key=lambda place: -(place_weight(place) + lift * shares.get(first[place][0], 0.0)),
    )
    return [first[place] for place in order] + fused[window:]
