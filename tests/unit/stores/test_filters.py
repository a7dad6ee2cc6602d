"""The filters' translations (shared/stores/filters.py)."""

from __future__ import annotations


def test_a_date_bound_shaped_like_a_date_but_not_one_filters_by_its_text() -> None:
    """The schema states a date's shape, not the calendar: '2024-02-30' is a valid request.
    It filters as its text compares (as in Postgres), instead of failing the search."""
    from shared.stores.filters import Filters, es_filters, range_terms

    filters = Filters.model_validate(
        {"metadata": {"day": {"gte": "2024-02-30", "lt": "2189-15-43"}}}
    )
    [clause] = es_filters(filters)
    bounds = clause["range"]["metadata_ranges"]
    [march] = range_terms({"day": "2024-03-01"})
    [february] = range_terms({"day": "2024-02-28"})
    assert bounds["gte"] <= march < bounds["lt"]
    assert february < bounds["gte"]
