"""The embedding cache in Postgres: vectors by model and a hash of exactly the text encoded,
so unchanged text is never encoded twice and a turn cut short (a time limit, a crash) keeps
what it encoded. Each call is a transaction of its own, opened with the pipeline's
``transactions``: what is cached is committed at once, whatever becomes of the batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shared.db import Transactions
from shared.stores.driver_errors import raises_postgres_errors
from shared.stores.embedding_cache import repository as repo


@raises_postgres_errors  # Concord's store errors, never SQLAlchemy's or psycopg's
class PgCachedEmbeddings:
    def __init__(self, transactions: Transactions) -> None:
        self.transactions = transactions

    def cached(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        if not keys:
            return {}
        with self.transactions() as uow:
            return repo.cached_embeddings(uow.session, model, keys)

    def keep(self, model: str, vectors: Mapping[str, np.ndarray]) -> None:
        if vectors:
            with self.transactions() as uow:
                repo.store_embeddings(uow.session, model, vectors)
