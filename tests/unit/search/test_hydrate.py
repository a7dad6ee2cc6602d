"""Hydration (shared/search/hydrate.py): which candidates a page reads, and when it stops."""

from __future__ import annotations

from tests.unit.search.test_diversify import _candidates


def test_likely_results_keep_the_per_document_cap_by_chunk_id() -> None:
    from shared.search.caps import within_cap
    from shared.stores.schemas import document_of_chunk

    def _first_within_cap(ids: list[str], cap: int | None, count: int) -> list[str]:
        return within_cap(ids, cap, document_of_chunk)[:count]

    ids = ["a:0", "a:1", "b:0", "a:2", "c:0", "b:1"]
    assert _first_within_cap(ids, None, 4) == ["a:0", "a:1", "b:0", "a:2"]
    assert _first_within_cap(ids, 1, 10) == ["a:0", "b:0", "c:0"]
    assert _first_within_cap(ids, 2, 4) == ["a:0", "a:1", "b:0", "c:0"]


def test_hydration_for_a_per_document_cap_stops_at_the_candidate_window(monkeypatch):
    from shared.search import hydrate
    from shared.search.schemas import SearchRequest
    from shared.search.values import Candidates, Query, Retrieved
    from shared.settings import Settings

    hydrated: list[int] = []

    def fake_hydrate(query, session, fused, *, vector, embeddings_for, cosines, read_ahead):
        hydrated.append(len(fused))
        return Candidates(_candidates(len(fused), documents=1))

    monkeypatch.setattr(hydrate, "hydrate", fake_hydrate)
    fused = [(f"d0:{i}", 1.0 / (i + 1)) for i in range(2000)]
    request = SearchRequest.model_validate(
        {"query": "q", "top_k": 10, "per_document_cap": 1, "mmr": {"lambda": 0.5}}
    )
    query = Query("t", request, Settings(search_candidate_window=100))
    page = hydrate.hydrate_page(query, None, Retrieved({}, [], [0.0], fused), offset=0)
    candidates = page.items
    assert len(candidates) <= 100 + max(hydrated)  # one slice past the window at most
    assert sum(hydrated) < 2000


def test_embeddings_are_read_once_into_copies_leaving_the_given_candidates_as_they_were():
    from dataclasses import replace

    from shared.search.hydrate import with_embeddings
    from shared.search.schemas import SearchRequest
    from shared.search.values import Query
    from shared.settings import Settings

    full = _candidates(4, documents=2)
    given = [replace(c, embedding=None) if i % 2 else c for i, c in enumerate(full)]
    reads: list[list[str]] = []

    class Vectors:  # the one method with_embeddings reads (a store holds all but d1:3's)
        def embeddings(self, tenant_id: str, ids: list[str]) -> dict[str, object]:
            reads.append(ids)
            return {c.chunk_id: c.embedding for c in full if c.chunk_id in ids[:1]}

    query = Query("t", SearchRequest.model_validate({"query": "q"}), Settings())
    loaded = with_embeddings(query, Vectors(), given)  # type: ignore[arg-type]
    assert reads == [["d1:1", "d1:3"]]
    assert [c.embedding is full[i].embedding for i, c in enumerate(loaded)] == [
        True,
        True,
        True,
        False,
    ]
    assert loaded[3].embedding is None and loaded[2] is given[2]  # none to read, no copy
    assert [c.embedding is None for c in given] == [False, True, False, True]  # untouched
