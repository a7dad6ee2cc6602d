"""Respond (shared/search/respond.py): a result's score is the one its mode ranks by, groups
keep the documents in the order of their best result, and a page's cursor points past its
last result into the one stored ranking, or is absent where nothing follows."""

from __future__ import annotations

from shared.search import cursors
from shared.search.respond import group_by_document, next_cursor, result
from shared.search.schemas import SearchRequest
from shared.search.values import Query, Retrieved
from shared.settings import get_settings
from shared.stores.memory import MemorySnapshots
from shared.stores.schemas import ArmHit
from tests.unit.search.test_diversify import _candidates

FUSED = [("d0:0", 0.031), ("d1:1", 0.030), ("d0:2", 0.029), ("d1:3", 0.020), ("d0:4", 0.010)]
BY_ARM = {
    "dense": {"d0:0": ArmHit("d0:0", 1, 0.71)},
    "lexical": {"d0:0": ArmHit("d0:0", 3, 12.5)},
}
FUSED_RANK = {cid: (rank, score) for rank, (cid, score) in enumerate(FUSED, 1)}


def test_a_results_score_is_the_one_its_mode_ranks_by() -> None:
    (first,) = _candidates(1, documents=1)  # chunk d0:0
    assert result(first, BY_ARM, FUSED_RANK, mode="dense").score == 0.71
    assert result(first, BY_ARM, FUSED_RANK, mode="lexical").score == 12.5
    assert result(first, BY_ARM, FUSED_RANK, mode="hybrid").score == 0.031


def test_groups_follow_each_documents_best_result() -> None:
    candidates = _candidates(4, documents=2)  # d0:0, d1:1, d0:2, d1:3 in rank order
    results = [result(c, BY_ARM, FUSED_RANK, mode="hybrid") for c in candidates]
    groups = group_by_document(results)
    assert [g.document_id for g in groups] == ["d0", "d1"]
    assert [[r.chunk_id for r in g.results] for g in groups] == [["d0:0", "d0:2"], ["d1:1", "d1:3"]]
    assert groups[0].score == results[0].score  # the group's best


def test_a_page_points_past_its_last_result_into_the_stored_ranking() -> None:
    request = SearchRequest(query="tide tables", top_k=2, paginate=True)
    query = Query("acme", request, get_settings())
    retrieved = Retrieved({}, [], [], FUSED)
    snapshots = MemorySnapshots()
    page = _candidates(3, documents=2)[:2]  # d0:0, d1:1
    cursor = next_cursor(query, retrieved, page, snapshots=snapshots, offset=0, cursor_id=None)
    assert cursor is not None and len(snapshots.kept) == 1
    cursor_id, following = cursors.decode(cursor)
    assert following == 2 and cursor_id in snapshots.kept  # d0:2 comes next
    # a later page reuses the first page's stored ranking
    again = next_cursor(query, retrieved, page, snapshots=snapshots, offset=2, cursor_id=cursor_id)
    assert again is not None and len(snapshots.kept) == 1
    # fewer results than asked for, or the ranking's last one: nothing follows
    short = next_cursor(query, retrieved, page[:1], snapshots=snapshots, offset=0, cursor_id=None)
    assert short is None
    last = [c for c in _candidates(5, documents=2) if c.chunk_id in ("d1:3", "d0:4")]
    end = next_cursor(query, retrieved, last, snapshots=snapshots, offset=3, cursor_id=None)
    assert end is None
