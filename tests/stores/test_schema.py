"""The schema comes from migrations, and the models agree with them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
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


def test_a_new_index_indexes_the_configured_analysis_alone_and_setup_keeps_older_indices(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tenant's index indexes the text fields its lexical analysis searches, without
    positions, and keeps the other family in _source only. ensure_index adds the fields an
    older index lacks and leaves the ones it has as they were made (Elasticsearch refuses to
    change ``index``); after the analysis setting changes, an index is searched under the
    analysis it was made under until a reindex."""
    from elasticsearch import BadRequestError

    from shared.stores.chunk_index import ElasticsearchChunkIndex
    from shared.stores.elastic import get_es
    from shared.stores.es_index import ensure_index, index_body, tenant_index
    from tests.helpers import index_orphan

    es, settings = get_es(), get_settings()
    generation = ensure_index(settings, es)

    def text_fields(index: str) -> dict[str, dict[str, Any]]:
        found = es.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        return {
            "text": found["text"],
            "stemmed.text": found["stemmed"]["properties"]["text"],
            **({"fingerprint": found["fingerprint"]} if "fingerprint" in found else {}),
        }

    tenant = f"lean-{uuid.uuid4().hex[:8]}"
    index_orphan(tenant, "Harbours are dredged each spring.")
    lean = text_fields(tenant_index(settings, generation, tenant))
    assert lean["text"]["index"] is False and lean["text"]["index_options"] == "freqs"
    assert lean["stemmed.text"].get("index", True) is True
    assert lean["stemmed.text"]["index_options"] == "freqs"
    python_arm = ElasticsearchChunkIndex(settings=settings)
    assert len(python_arm.lexical_search(tenant, "harbour dredging", None, 10)) == 1

    # An index made by an older release: both families indexed with positions, and without a
    # field added since.
    older = tenant_index(settings, generation, f"older-{uuid.uuid4().hex[:8]}")
    mappings = index_body(settings)["mappings"]
    plain = {"type": "text", "analyzer": "standard"}
    properties = {k: v for k, v in mappings["properties"].items() if k != "fingerprint"}
    properties.update(
        text=plain, stemmed={"properties": {"text": {**plain, "analyzer": "whitespace"}}}
    )
    es.indices.create(
        index=older,
        mappings={**mappings, "properties": properties},
        aliases={settings.es_chunks_alias(): {}},
    )
    try:
        assert ensure_index(settings, es) == generation  # no conflict with the older index
        kept = text_fields(older)
        assert kept["text"].get("index", True) is True and "index_options" not in kept["text"]
        assert kept["fingerprint"] == {"type": "long"}  # added
        assert text_fields(tenant_index(settings, generation, tenant)) == lean  # as made
    finally:
        es.indices.delete(index=older)

    # CONCORD_LEXICAL_ANALYSIS changed since the index was made: until a reindex, it is
    # searched under the analysis it was made under (said once in the log), not refused.
    es_arm = ElasticsearchChunkIndex(
        settings=settings.model_copy(update={"lexical_analysis": "elasticsearch"})
    )
    with caplog.at_level("WARNING"):
        for _ in range(2):
            assert es_arm.lexical_search(tenant, "harbour dredging", None, 10) == (
                python_arm.lexical_search(tenant, "harbour dredging", None, 10)
            )
    assert caplog.text.count("until `concord reindex`") == 1
    with pytest.raises(BadRequestError):  # what the fallback is for: the field is not indexed
        es.search(index=tenant_index(settings, generation, tenant), query={"match": {"text": "x"}})
