"""One filter model, two translations: SQL conditions on chunks (pgvector arm) and
Elasticsearch ``bool.filter`` clauses (BM25 arm), with the same meaning in both.

Equality and IN lists compare JSON values; ranges compare numbers, or ISO-8601 dates as
strings. In Elasticsearch, equality uses the ``metadata`` flattened field, number ranges the
``metadata_num`` doubles and date ranges the ``metadata_date`` dates (the relay fills them).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import ColumnElement, Numeric, and_, case, cast, func, or_

from shared.models import Chunk
from shared.search.schemas import Filters, Range, Scalar


def sql_conditions(filters: Filters) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    for key, condition in filters.metadata.items():
        if isinstance(condition, Range):
            conditions.append(_sql_range(key, condition))
        elif isinstance(condition, list):
            conditions.append(or_(*(Chunk.metadata_.contains({key: v}) for v in condition)))
        else:
            conditions.append(Chunk.metadata_.contains({key: condition}))
    if filters.document_ids:
        conditions.append(Chunk.document_id.in_(filters.document_ids))
    return conditions


def _sql_range(key: str, condition: Range) -> ColumnElement[bool]:
    value = Chunk.metadata_[key]
    kind = "string" if condition.is_date else "number"
    # CASE guards the cast: SQL does not promise to test jsonb_typeof before casting.
    typed = case(
        (
            func.jsonb_typeof(value) == kind,
            value.astext if condition.is_date else cast(value.astext, Numeric),
        ),
        else_=None,
    )
    ops = {"gt": typed.__gt__, "gte": typed.__ge__, "lt": typed.__lt__, "lte": typed.__le__}
    return and_(*(ops[op](bound) for op, bound in condition.bounds().items()))


def _keyword(value: Scalar) -> str:
    # The flattened field holds every leaf as a keyword: numbers and booleans as their JSON text.
    return value if isinstance(value, str) else json.dumps(value)


def es_filters(filters: Filters) -> list[dict[str, Any]]:
    clauses: list[dict[str, Any]] = []
    for key, condition in filters.metadata.items():
        if isinstance(condition, Range):
            field = f"metadata_date.{key}" if condition.is_date else f"metadata_num.{key}"
            clauses.append({"range": {field: condition.bounds()}})
        elif isinstance(condition, list):
            clauses.append({"terms": {f"metadata.{key}": [_keyword(v) for v in condition]}})
        else:
            clauses.append({"term": {f"metadata.{key}": _keyword(condition)}})
    if filters.document_ids:
        clauses.append({"terms": {"document_id": [str(d) for d in filters.document_ids]}})
    return clauses


def typed_metadata(metadata: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The range-searchable copies of a document's metadata for Elasticsearch."""
    from shared.search.schemas import ISO_DATE

    numbers = {
        k: v for k, v in metadata.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    dates = {k: v for k, v in metadata.items() if isinstance(v, str) and ISO_DATE.match(v)}
    return {"metadata_num": numbers, "metadata_date": dates}
