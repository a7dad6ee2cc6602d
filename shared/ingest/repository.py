"""All SQL of the ingest steps' own table: the embedding cache, keyed by model and text hash,
so that unchanged text is never embedded twice. Functions take a session and never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from shared.db import any_of
from shared.models import EmbeddingCache
from shared.vector_type import vector_bytes, vector_from_bytes


def cached_embeddings(session: Session, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
    if not hashes:
        return {}
    rows = session.execute(
        select(EmbeddingCache.text_hash, vector_bytes(EmbeddingCache.embedding)).where(
            EmbeddingCache.model == model, any_of(EmbeddingCache.text_hash, hashes)
        )
    )
    return {h: vector_from_bytes(raw) for h, raw in rows}


def store_embeddings(session: Session, model: str, vectors: dict[str, np.ndarray]) -> None:
    if not vectors:
        return
    # Executed with a list of rows, sent as multi-row VALUES batches (see insert_rows).
    session.connection().execute(
        insert(cast(Table, EmbeddingCache.__table__)).on_conflict_do_nothing(),
        [{"model": model, "text_hash": h, "embedding": v} for h, v in vectors.items()],
    )
