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

    def fake_hydrate(query, session, fused, *, vector, embeddings_for, cosines):
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
