"""Server-side highlights: where a result's text holds the query's terms, as character offsets
into the result's ``text``. Terms are compared as the BM25 arm compares them (lowercased,
stop words dropped, Porter-stemmed: shared/stores/english_analysis.py), whichever arm found
the result, so a dense hit that shares words with the query is highlighted the same way and
one that shares none has no highlights (it matched on meaning)."""

from __future__ import annotations

from shared.stores.english_analysis import analyze, term_spans


def query_terms(query: str) -> frozenset[str]:
    return frozenset(analyze(query).split())


def highlight(text: str, terms: frozenset[str]) -> list[tuple[int, int]]:
    """(start, end) of every word of ``text`` whose term is one of ``terms``, in order."""
    if not terms:
        return []
    return [(start, end) for start, end, term in term_spans(text) if term in terms]
