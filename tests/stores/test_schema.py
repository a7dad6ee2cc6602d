"""The schema comes from migrations, and the models agree with them."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from shared.db import get_engine
from shared.migrate import alembic_config
from shared.settings import get_settings


def test_models_and_migrations_do_not_drift():
    command.check(alembic_config(get_settings()))  # raises when autogenerate finds a diff


def test_chunks_are_partitioned_by_tenant_and_the_shared_partition_has_no_graph():
    """Small tenants share the DEFAULT partition and are scanned exactly; the HNSW graphs
    are per tenant partition (tests/stores/test_partitions.py)."""
    with get_engine().connect() as conn:
        strategy = conn.execute(
            text("SELECT partstrat FROM pg_partitioned_table WHERE partrelid = 'chunks'::regclass")
        ).scalar_one()
        default = conn.execute(
            text(
                "SELECT c.relname FROM pg_partitioned_table p JOIN pg_class c"
                " ON c.oid = p.partdefid WHERE p.partrelid = 'chunks'::regclass"
            )
        ).scalar_one()
        graphs = conn.execute(
            text(
                "SELECT count(*) FROM pg_indexes WHERE tablename = 'chunks_shared'"
                " AND indexdef LIKE '%hnsw%'"
            )
        ).scalar_one()
    assert (strategy, default, graphs) == ("l", "chunks_shared", 0)


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
