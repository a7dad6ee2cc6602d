"""The schema: Postgres's comes from migrations and the models agree with them;
Elasticsearch's mapping is what ensure_index and the index template give each index."""

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
    are per tenant partition (tests/integration/stores/test_partitions.py)."""
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


def _text_fields(index: str) -> dict[str, dict[str, Any]]:
    """An index's mapping of its text fields (and of ``fingerprint``, where it has one)."""
    from shared.stores.elastic import get_es

    found = get_es().indices.get_mapping(index=index)[index]["mappings"]["properties"]
    return {
        "text": found["text"],
        **{f"stemmed.{k}": v for k, v in found["stemmed"]["properties"].items()},
        **({"fingerprint": found["fingerprint"]} if "fingerprint" in found else {}),
    }


def _tenant_with_a_copy() -> tuple[str, str]:
    """A new tenant with one copy in its own index: (tenant id, the concrete index)."""
    from shared.stores.es_index import ensure_index, tenant_index
    from tests.helpers import index_orphan

    settings = get_settings()
    generation = ensure_index(settings)
    tenant = f"lean-{uuid.uuid4().hex[:8]}"
    index_orphan(tenant, "Harbours are dredged each spring.")
    return tenant, tenant_index(settings, generation, tenant)


def test_a_new_index_indexes_the_text_fields_of_its_analysis_alone_without_positions() -> None:
    """Under the default analysis the stemmed fields are indexed (term frequencies, no
    positions) and the raw ones are kept in _source only; the search finds the copy."""
    from shared.stores.chunk_index import ElasticsearchChunkIndex

    tenant, index = _tenant_with_a_copy()
    fields = _text_fields(index)
    assert fields["text"]["index"] is False
    for name in ("stemmed.title", "stemmed.section", "stemmed.text"):
        assert fields[name].get("index", True) is True
        assert fields[name]["index_options"] == "freqs"
    hits = ElasticsearchChunkIndex().lexical_search(tenant, "harbour dredging", None, 10)
    assert len(hits) == 1


def test_setup_adds_the_fields_an_older_index_lacks_and_keeps_the_ones_it_has() -> None:
    """An index an older release made (every text field indexed with positions, and without
    fields added since): ensure_index must not put the new text fields' parameters on it
    (Elasticsearch refuses a change of ``index``: setup would fail), and adds the fields it
    lacks, sub-fields of ``stemmed`` among them."""
    from shared.stores.elastic import get_es
    from shared.stores.es_index import ensure_index, index_body, tenant_index

    es, settings = get_es(), get_settings()
    generation = ensure_index(settings, es)
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
        assert ensure_index(settings, es) == generation
        fields = _text_fields(older)
        assert fields["fingerprint"] == {"type": "long"}
        assert fields["stemmed.title"]["index_options"] == "freqs"  # added as new ones are
        assert fields["stemmed.section"]["index_options"] == "freqs"
        assert "index_options" not in fields["stemmed.text"]  # kept as it was made
    finally:
        es.indices.delete(index=older)


def test_index_names_are_joined_into_requests_that_fit_a_url() -> None:
    from shared.stores.es_index import _joined_within

    names = [f"index-{i:02d}" for i in range(10)]  # 8 characters each
    parts = _joined_within(names, limit=30)
    assert parts == [",".join(names[i : i + 3]) for i in range(0, 9, 3)] + [names[9]]
    assert all(len(part) <= 30 for part in parts)
    assert _joined_within(["a-name-longer-than-the-limit"], limit=5) == [
        "a-name-longer-than-the-limit"
    ]


def test_an_index_made_under_the_other_analysis_is_searched_under_it_until_a_reindex(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After CONCORD_LEXICAL_ANALYSIS changes, an index made before indexes the other
    family: its searches use that family (the first one learns it from Elasticsearch's
    refusal, the next ones go straight there), logged once and counted every time."""
    from elasticsearch import BadRequestError

    from shared.metrics import LEXICAL_ANALYSIS_FALLBACKS
    from shared.stores import chunk_index
    from shared.stores.chunk_index import ElasticsearchChunkIndex
    from shared.stores.elastic import get_es

    tenant, index = _tenant_with_a_copy()
    settings = get_settings()
    with pytest.raises(BadRequestError, match="since it is not indexed"):  # the premise
        get_es().search(index=index, query={"match": {"text": "harbour"}})
    under_default = ElasticsearchChunkIndex(settings=settings)
    under_raw = ElasticsearchChunkIndex(
        settings=settings.model_copy(update={"lexical_analysis": "elasticsearch"})
    )
    expected = under_default.lexical_search(tenant, "harbour dredging", None, 10)
    counted = LEXICAL_ANALYSIS_FALLBACKS._value.get()
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert under_raw.lexical_search(tenant, "harbour dredging", None, 10) == expected
    assert caplog.text.count("until `concord reindex`") == 1
    assert LEXICAL_ANALYSIS_FALLBACKS._value.get() == counted + 3
    # Once reindexed, the index has the configured fields: the next search finds that out
    # and forgets the fallback (here the process learnt the other analysis for the tenant).
    chunk_index._found_analysis[tenant] = "elasticsearch"
    assert under_default.lexical_search(tenant, "harbour dredging", None, 10) == expected
    assert tenant not in chunk_index._found_analysis
    assert LEXICAL_ANALYSIS_FALLBACKS._value.get() == counted + 3
