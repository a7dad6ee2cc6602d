"""Lifts: among the first candidates, a document whose title names what the question asks
about, or whose passages write the question's exact names, comes before one that only
matches the question's other words.

**Titles.** A question that names its subject ("What exit status does *ls* return ...", "Is
*libtasn1* safe to use from multiple threads?") is often outranked by another document's chunk
that matches the rest of its words better: xargs' exit statuses, libffi's thread safety. Both
arms score a chunk by its own words, and the title every chunk of a document shares is one
field of three to BM25 and a few words of the text the encoder reads. So the first
``search_passage_window`` fused candidates (after the passages stage has ordered each
document's own) are ordered by the term of their place (the passages' curve: 1 first, 0.5
eleventh) plus ``search_title_lift`` times their title's *share*: the weight (IDF in
the tenant's corpus) of the heaviest question term the title holds, over that of the
question's heaviest term the corpus holds, for titles of at most ``SUBJECT_TITLE_WORDS``
words. At the default 0.2 a title naming the question's rarest term is worth two places at
the top of the window (the first over the third) and about ten at its end (the tenth over the
twentieth); one naming only a common word of the question ("file", "news"), a fraction of it.

Measured on the real-document dev set's tune half (the file holding the answer's MRR@10
0.945 → 0.958 at 0.2, 0.963 at 0.5) and on SciFact's train split, whose titles are a paper's
sentence and hold a claim's rare words ("dorsal", "myosin") without being what it is about:
lifting every title cost its hybrid nDCG@10 0.001 at 0.2 but 0.012 at 0.3 (and its test
split 0.01 at 0.2); titles of at most 4 words, 0.7120 → 0.7123 at 0.2 (3 words 0.7118, 5
words 0.7082).

**Exact names.** A question that writes an option, a code or an identifier ("sort
*--buffer-size*", "*ENOTFOUND*", "*==19182==*") is outranked by a document that matches its
other words better: du's and ls's man pages on sizes above sort's. BM25 splits the name into
words ("buffer", "size") that the other pages hold too, and the passages stage orders only a
document's own chunks by the names they write. So each candidate's document also gets
``search_name_lift`` times its *name share*: the share of the question's exact names
(``passages.exact_names``) that the best of its chunks among the candidates writes. At the
default 0.1 a document writing all of them is worth one place at the top of the window and
about five at its end. Measured on the dev set's tune half: file MRR@10 0.958 → 0.962 at 0.1
(0.958 at 0.05, 0.962 at 0.15, 0.959 at 0.2, where the answer chunk came first for one
question fewer).

The variants tried and left out, and both halves' figures, are in
docs/evaluation-and-benchmarks.md, "Real documents".
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TypeGuard

from shared.search.coverage import CorpusCounts
from shared.search.passages import Question, place_weight
from shared.stores.english_analysis import analyze_repeated, stemmed_words
from shared.stores.schemas import ChunkText, document_of_chunk

# A title of at most this many distinct words (stop words aside; "ssh_config" is two) names
# its document's subject (a command, a library, a manual: "man-ls", "libtasn1",
# "valgrind-quick-start"); a longer one is a sentence (a paper's, a post's) whose words BM25
# already scores in the title field, and holds a question's rare words without being what the
# question is about.
SUBJECT_TITLE_WORDS = 4


def liftable(counts: CorpusCounts | None) -> TypeGuard[CorpusCounts]:
    """Whether a search's titles can be weighed: without the corpus's counts (Elasticsearch
    could not count them in time, or it analyses the text itself:
    ``CONCORD_LEXICAL_ANALYSIS=elasticsearch``) every term weighs the same, and any shared
    word ("file") would lift as fully as the question's subject."""
    return counts is not None and counts.known


def title_shares(
    question: Question, counts: CorpusCounts | None, texts: Mapping[str, ChunkText]
) -> dict[str, float]:
    """Chunk id -> the share of the question's heaviest term that the chunk's title holds,
    for titles of at most ``SUBJECT_TITLE_WORDS`` words (the others, and those whose title
    holds no question term, are left out); none without the corpus's counts (:func:`liftable`).
    A term the corpus holds nowhere (the casual "a *bunch* of threads") counts neither way."""
    if not liftable(counts):
        return {}
    held_terms = {s: w for s, w in question.weights.items() if counts.holding.get(s)}
    heaviest = max(held_terms.values(), default=0.0)
    if heaviest <= 0:
        return {}
    shares = {}
    for chunk_id, chunk in texts.items():
        terms = _subject_title_terms(chunk.title)
        held = max((w for stem, w in held_terms.items() if stem in terms), default=0.0)
        if held > 0:
            shares[chunk_id] = held / heaviest
    return shares


@lru_cache(maxsize=4096)
def _subject_title_terms(title: str) -> frozenset[str]:
    """The terms of ``title`` as BM25 analyses it, if it is short enough to name a subject."""
    if len(set(stemmed_words(title.replace("_", " ")))) > SUBJECT_TITLE_WORDS:
        return frozenset()
    return frozenset(analyze_repeated(title).split())


def name_shares(question: Question, texts: Mapping[str, ChunkText]) -> dict[str, float]:
    """Chunk id -> the share of the question's exact names that the best chunk of its
    document among ``texts`` writes (in its text or its section), for the documents that
    write any: a document's chunks share it, as they share a title."""
    if not question.exact:
        return {}
    best: dict[str, float] = {}
    for chunk_id, chunk in texts.items():
        written = question.names_written(chunk.text, chunk.section) / len(question.exact)
        document = document_of_chunk(chunk_id)
        best[document] = max(best.get(document, 0.0), written)
    return {
        chunk_id: best[document]
        for chunk_id in texts
        if best.get(document := document_of_chunk(chunk_id))
    }


def document_lifts(
    question: Question,
    counts: CorpusCounts | None,
    texts: Mapping[str, ChunkText],
    *,
    title_lift: float,
    name_lift: float,
) -> dict[str, float]:
    """Chunk id -> what its place's term gains: ``title_lift`` x its title's share plus
    ``name_lift`` x its document's name share (the chunks that gain nothing left out)."""
    titles = title_shares(question, counts, texts) if title_lift else {}
    names = name_shares(question, texts) if name_lift else {}
    return {
        chunk_id: title_lift * titles.get(chunk_id, 0.0) + name_lift * names.get(chunk_id, 0.0)
        for chunk_id in titles.keys() | names.keys()
    }


def lift_documents(
    fused: list[tuple[str, float]], lifts: Mapping[str, float], *, window: int
) -> list[tuple[str, float]]:
    """``fused`` with its first ``window`` candidates ordered by their place's term plus their
    lift (ties keep the fused order); the rest as they were. A document's chunks share a
    lift: they keep their order."""
    first = fused[:window]
    keys = [place_weight(place) + lifts.get(cid, 0.0) for place, (cid, _) in enumerate(first)]
    order = sorted(range(len(first)), key=lambda place: -keys[place])
    return [first[place] for place in order] + fused[window:]
