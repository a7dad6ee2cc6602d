"""The chunk index raises Concord's store errors, never the Elasticsearch client's: callers
(the relay, the search's lexical arm, reconcile, the admin views) catch StoreError alone."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from elastic_transport import ApiResponseMeta, HttpHeaders, NodeConfig
from elasticsearch import ApiError, ConnectionError, Elasticsearch

from shared.errors import StoreRejected, StoreUnavailable
from shared.settings import get_settings
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.elastic import store_error

LINES = [("t-1", [{"index": {"_id": "d:0"}}, {"text": "kelp"}])]
# A call of every public method that reaches Elasticsearch (forget only drops a cache entry).
CALLS: dict[str, tuple[Any, ...]] = {
    "layout": (),
    "per_tenant": (),
    "prepare": (["t-1"],),
    "bulk": (LINES,),
    "reindex_target": (),
    "bulk_to": ("g2", LINES),
    "exists": ("t-1", "d:0"),
    "count_of_tenant": ("t-1",),
    "count_of_document": ("t-1", "d"),
    "cluster_status": (1.0,),
    "lexical_search": ("t-1", "kelp forests", None, 5),
    "term_counts": ("t-1", ["kelp"]),
    "refresh": ("t-1",),
    "tenants": (),
    "bucket_stats": ("t-1",),
    "copies_in_buckets": ("t-1", [1, 2]),
    "foreign_copies": ("t-1",),
    "fingerprints_in_buckets": ("t-1", [1]),
    "copies_by_ids": (["d:0"],),
    "start_reindex": (),
    "mark_reindex_progress": ("g2", "d:0"),
    "finish_reindex": ("g2",),
}


def _unreachable() -> ElasticsearchChunkIndex:
    # an alias of its own: no layout this process read of the suite's index is reused
    settings = get_settings().model_copy(update={"es_index_prefix": "unreachable-test"})
    return ElasticsearchChunkIndex(Elasticsearch("http://127.0.0.1:9", max_retries=0), settings)


def test_every_method_raises_store_unavailable_when_elasticsearch_does_not_answer() -> None:
    public = {  # every role's (shared/stores/chunk_index/)
        name
        for role in ElasticsearchChunkIndex.__mro__
        for name, member in vars(role).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    assert public - set(CALLS) <= {"forget", "write", "copy_to"}
    index = _unreachable()
    for name, args in CALLS.items():
        with pytest.raises(StoreUnavailable) as raised:
            getattr(index, name)(*args)
        assert raised.value.status is None and raised.value.store == "Elasticsearch", name
        assert isinstance(raised.value.__cause__, ConnectionError), name
        assert raised.value.headers == {"Retry-After": "5"}  # the API's 503 says when to retry


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, StoreRejected), (404, StoreRejected), (413, StoreRejected), (429, StoreUnavailable),
     (500, StoreUnavailable), (503, StoreUnavailable)],
)  # fmt: skip
def test_an_answer_keeps_its_status_and_only_429_and_5xx_are_worth_a_retry(
    status: int, kind: type[Exception]
) -> None:
    meta = ApiResponseMeta(status, "1.1", HttpHeaders(), 0.0, NodeConfig("http", "x", 1))
    error = store_error(ApiError("refused", meta, {"error": "refused"}))
    assert type(error) is kind and error.status == status
