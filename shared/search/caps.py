"""The per-document cap, which three stages apply to their own lists: fusion to a paginated
search's ranking (once, so that the cap holds across pages), hydration to what it reads, and
diversify to the page's results."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from shared.search.values import Candidate

T = TypeVar("T")


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


def cap_per_document(candidates: list[Candidate], cap: int | None) -> list[Candidate]:
    return within_cap(candidates, cap, lambda c: c.document_id)
