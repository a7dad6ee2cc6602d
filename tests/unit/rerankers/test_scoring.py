"""Loading and scoring rerankers (shared/rerankers/scoring.py)."""

from __future__ import annotations

from typing import Any


def test_a_reranker_loading_for_one_tenant_does_not_hold_up_anothers(monkeypatch) -> None:
    """A trained reranker loads in seconds; a search whose own reranker is loaded (or
    loading for itself) does not wait for another model's load."""
    import threading
    import time

    from shared.rerankers import scoring
    from shared.settings import Settings

    slow_started, release = threading.Event(), threading.Event()

    def load(kind: str, model: str, *args: Any) -> Any:
        if model == "tenant-a-model":
            slow_started.set()
            release.wait(10)
        return model

    monkeypatch.setattr(scoring, "_load", load)
    settings = Settings()
    slow = threading.Thread(
        target=scoring._loaded, args=("cross-encoder", "tenant-a-model", settings)
    )
    slow.start()
    assert slow_started.wait(5)
    started = time.monotonic()
    assert scoring._loaded("cross-encoder", "tenant-b-model", settings) == "tenant-b-model"
    assert time.monotonic() - started < 1.0
    release.set()
    slow.join(5)
