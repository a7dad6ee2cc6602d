"""The embedding cache in memory: a dictionary per model, kept as the Postgres cache keeps
its rows (the first vector kept under a key stays)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class MemoryCachedEmbeddings:
    def __init__(self) -> None:
        self.kept: dict[str, dict[str, np.ndarray]] = {}

    def cached(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        of_model = self.kept.get(model, {})
        return {k: of_model[k] for k in keys if k in of_model}

    def keep(self, model: str, vectors: Mapping[str, np.ndarray]) -> None:
        of_model = self.kept.setdefault(model, {})
        for key, vector in vectors.items():
            of_model.setdefault(key, vector)
