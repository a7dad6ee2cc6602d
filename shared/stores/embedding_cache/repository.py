"""All SQL of the embedding cache's table, keyed by model and text hash. Functions take a
session and never commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.models import EmbeddingCache
from shared.vector_type import vector_bytes, vector_from_bytes


def cached_embeddings(session: Session, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
    rows = session.execute(
        select(EmbeddingCache.text_hash, vector_bytes(EmbeddingCache.embedding)).where(
            EmbeddingCache.model == model, any_of(EmbeddingCache.text_hash, keys)
        )
    )
    return {key: vector_from_bytes(raw) for key, raw in rows}


def store_embeddings(session: Session, model: str, vectors: Mapping[str, np.ndarray]) -> None:
    """The vectors not cached yet; a key cached already keeps its first vector."""
    # Executed with a list of rows, sent as multi-row VALUES batches (see insert_rows).
    session.connection().execute(
        insert(cast(Table, EmbeddingCache.__table__)).on_conflict_do_nothing(),
        [{"model": model, "text_hash": k, "embedding": v} for k, v in vectors.items()],
    )
