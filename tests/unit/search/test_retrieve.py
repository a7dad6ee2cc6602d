"""Retrieval (shared/search/retrieve.py): the query's vector and its cache."""

from __future__ import annotations

import pytest


def test_query_embeddings_are_cached_per_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache hit is faster than a miss and Server-Timing shows it: a tenant must not learn
    from it what another searched for."""
    import numpy as np

    from shared.search import retrieve
    from shared.settings import Settings

    encoded: list[str] = []

    class Encoder:
        def embed_query(self, query: str, threads: int = 1) -> np.ndarray:
            encoded.append(query)
            return np.ones(4, dtype=np.float32)

    monkeypatch.setattr(retrieve, "get_embedder", lambda: Encoder())
    settings = Settings(query_cache_size=17)  # a cache of its own for this test
    retrieve.query_vector("secret merger plans", settings, scope="tenant-a")
    retrieve.query_vector("secret merger plans", settings, scope="tenant-a")
    assert encoded == ["secret merger plans"]
    retrieve.query_vector("secret merger plans", settings, scope="tenant-b")
    assert encoded == ["secret merger plans"] * 2
