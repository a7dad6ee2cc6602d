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


def test_the_index_refreshes_on_elasticsearch_defaults_so_idle_shards_skip_refreshes() -> None:
    """An explicit refresh_interval (even Elasticsearch's own 1 s) turns off the skipping of
    refreshes on shards nobody searches; ensure_index removes one an older version set."""
    from shared.stores.elastic import get_es
    from shared.stores.es_index import anchor_index, ensure_index

    es, settings = get_es(), get_settings()
    generation = ensure_index(settings, es)
    index = anchor_index(settings, generation)  # one of the live indices

    def explicit_refresh_interval() -> object:
        found = es.indices.get_settings(index=index, name="index.refresh_interval")
        return found.get(index, {}).get("settings", {}).get("index", {}).get("refresh_interval")

    assert explicit_refresh_interval() is None
    es.indices.put_settings(index=index, settings={"index": {"refresh_interval": "1s"}})
    assert explicit_refresh_interval() == "1s"
    assert ensure_index(settings, es) == generation
    assert explicit_refresh_interval() is None
