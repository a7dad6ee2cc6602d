"""The rerank stage, pluggable: a cross-encoder, a second (stronger) bi-encoder, or none.

It scores a bounded window of fused candidates within a time budget. Models load once per
process; ``warm_up`` loads the configured one at start-up so the first request's budget is not
spent loading weights. On timeout or error the caller keeps the fused order and says
``rerank_unavailable``.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache
from typing import Protocol

import numpy as np

from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)

# One thread: a stage that overran its budget finishes in the background without piling up
# more concurrent model calls; one still waiting for the thread when its budget ends is
# cancelled (see rerank_within_budget).
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")


class RerankUnavailable(Exception):
    """The stage timed out or failed; the fused order stands."""


class Reranker(Protocol):
    name: str

    def score(self, query: str, passages: list[str]) -> list[float]: ...


def rerank_passage(title: str, text: str) -> str:
    """What a reranker reads for one candidate, in training and in search alike: the chunk
    with its document's title, which often carries the words a query uses."""
    return f"{title}\n{text}" if title else text


class CrossEncoderReranker:
    """sentence-transformers ``CrossEncoder``: scores (query, passage) pairs jointly.

    ``quantize="int8"`` swaps its linear layers for dynamically quantized ones (torch, CPU):
    about twice the pairs per second on this kind of machine, at a small cost in score
    precision."""

    name = "cross-encoder"

    def __init__(
        self, model: str, max_length: int, batch_size: int, device: str, quantize: str = "none"
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(model, max_length=max_length, device=device)
        if quantize == "int8" and device == "cpu":
            import torch

            # In place: the CrossEncoder keeps its own reference to the transformer.
            torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
                self.model[0].model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
            )
        self.batch_size = batch_size

    def score(self, query: str, passages: list[str]) -> list[float]:
        pairs = [(query, p) for p in passages]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        return [float(s) for s in np.asarray(scores).reshape(-1)]


class BiEncoderReranker:
    """A second, stronger bi-encoder re-scoring the window by cosine similarity."""

    name = "bi-encoder"

    def __init__(
        self, model: str, max_length: int, batch_size: int, device: str, query_prompt: str = ""
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model, device=device)
        self.model.max_seq_length = max_length
        self.batch_size = batch_size
        self.query_prompt = query_prompt

    def score(self, query: str, passages: list[str]) -> list[float]:
        vectors = self.model.encode(
            [self.query_prompt + query, *passages],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [float(v) for v in np.asarray(vectors[1:]) @ np.asarray(vectors[0])]


# One lock per model: a search whose reranker is loaded never waits while another tenant's
# trained reranker loads (seconds), only one that needs the same model does.
_locks: dict[tuple[str, ...], threading.Lock] = {}
_locks_guard = threading.Lock()


@lru_cache(maxsize=4)
def _load(
    kind: str, model: str, max_length: int, batch_size: int, device: str, quantize: str
) -> Reranker:
    if kind == "cross-encoder":
        return CrossEncoderReranker(model, max_length, batch_size, device, quantize)
    if kind == "bi-encoder":
        return BiEncoderReranker(model, max_length, batch_size, device)
    raise ValueError(f"unknown reranker kind {kind!r}")


def get_reranker(settings: Settings | None = None) -> Reranker | None:
    settings = settings or get_settings()
    if settings.rerank_kind == "none" or not settings.rerank_model:
        return None
    return _loaded(settings.rerank_kind, settings.rerank_model, settings)


def get_trained_reranker(path: str, settings: Settings | None = None) -> Reranker:
    """A cross-encoder from ``concord reranker train``, loaded once per process per path."""
    return _loaded("cross-encoder", path, settings or get_settings())


def _loaded(kind: str, model: str, settings: Settings) -> Reranker:
    key = (kind, model, settings.embedding_device, settings.rerank_quantize)
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        return _load(
            kind,
            model,
            settings.rerank_max_length,
            settings.rerank_batch_size,
            settings.embedding_device,
            settings.rerank_quantize,
        )


def warm_up(settings: Settings | None = None) -> None:
    reranker = get_reranker(settings)
    if reranker is not None:
        reranker.score("warm up", ["a passage"])


def rerank_within_budget(
    reranker: Reranker, query: str, passages: list[str], budget_ms: int
) -> list[float]:
    """The reranker's scores, or RerankUnavailable once ``budget_ms`` has passed.

    Work whose budget ran out before the thread took it up is cancelled, not left queued: a
    caller sending wide windows with tiny budgets would otherwise pile up model work that every
    later search (any tenant's) waits behind. Only a call already running finishes late."""
    future = _executor.submit(reranker.score, query, passages)
    try:
        return future.result(timeout=budget_ms / 1000)
    except FutureTimeout as e:
        future.cancel()
        raise RerankUnavailable(f"rerank exceeded its {budget_ms} ms budget") from e
    except Exception as e:
        log.warning("rerank failed: %s: %s", type(e).__name__, e)
        raise RerankUnavailable(f"{type(e).__name__}: {e}") from e
