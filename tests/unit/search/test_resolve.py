"""Resolve (shared/search/resolve.py): the request as the search will run it. A search that
names no profile and no model reads nothing of Postgres (the tenant's calibrated threshold
aside, which the calibration module keeps per process), and a request the search cannot
keep its promises for is refused before any store is searched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shared.errors import BadRequest
from shared.search.resolve import resolve
from shared.search.schemas import SearchRequest
from shared.settings import get_settings


@contextmanager
def no_transaction() -> Iterator[None]:
    raise AssertionError("resolve opened a transaction")
    yield


def test_a_plain_request_resolves_to_itself_without_reading_postgres() -> None:
    settings = get_settings().model_copy(update={"policy_calibration": False})
    request = SearchRequest(query="how do I resume a download")
    query = resolve(no_transaction, "acme", request, settings=settings)  # type: ignore[arg-type]
    assert (query.tenant_id, query.request, query.settings) == ("acme", request, settings)
    assert query.answerability is None and query.trained_reranker is None
    assert query.calibrated_min_score is None


def test_a_request_with_its_own_threshold_asks_for_no_calibrated_one() -> None:
    request = SearchRequest(query="resume a download", policy={"min_score": 0.5})
    query = resolve(no_transaction, "acme", request, settings=get_settings())  # type: ignore[arg-type]
    assert query.calibrated_min_score is None and query.request.policy.min_score == 0.5


@pytest.mark.parametrize(
    "reorders", [{"rerank": {"enabled": True}}, {"mmr": {"lambda": 0.5}}], ids=["rerank", "mmr"]
)
def test_paging_refuses_what_reorders_only_the_first_page(reorders: dict[str, object]) -> None:
    request = SearchRequest(query="resume a download", paginate=True, **reorders)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="turn them off to paginate"):
        resolve(no_transaction, "acme", request, settings=get_settings())  # type: ignore[arg-type]
