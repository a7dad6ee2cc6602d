"""The schema comes from migrations, and the models agree with them."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from shared.db import get_engine
from shared.migrate import alembic_config
from shared.settings import get_settings


def test_models_and_migrations_do_not_drift():
    command.check(alembic_config(get_settings()))  # raises when autogenerate finds a diff


def test_pgvector_hnsw_index_exists():
    with get_engine().connect() as conn:
        indexdef = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_chunks_embedding_hnsw'")
        ).scalar_one()
    assert "hnsw" in indexdef and "vector_cosine_ops" in indexdef
