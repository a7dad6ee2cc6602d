"""One filter model, two translations: SQL conditions on chunks (pgvector arm) and
Elasticsearch ``bool.filter`` clauses (BM25 arm), with the same meaning in both.

Equality and IN lists compare JSON values; ranges compare numbers, or ISO-8601 dates as
strings. In Elasticsearch, equality uses the ``metadata`` flattened field and ranges the
``metadata_ranges`` keywords (the relay fills them).

``metadata_ranges`` holds one keyword per number or date value: ``<key> US <kind><value>``,
the value encoded so that keyword order is numeric (or chronological) order. One field for
every key of every tenant: a per-key typed field (``metadata_num.<key>``, as before) let one
tenant's keys grow the shared mapping until Elasticsearch's field limit refused everyone's
new keys, and let a key's type or a dotted key (``year`` vs ``year.x``) conflict across
tenants.
"""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
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
            clauses.append(_es_range(key, condition))
        elif isinstance(condition, list):
            clauses.append({"terms": {f"metadata.{key}": [_keyword(v) for v in condition]}})
        else:
            clauses.append({"term": {f"metadata.{key}": _keyword(condition)}})
    if filters.document_ids:
        clauses.append({"terms": {"document_id": [str(d) for d in filters.document_ids]}})
    return clauses


KEY_END = "\x1f"  # ends the key in a range term; upload keys cannot hold it
NUMBER, DATE = "n", "d"
AFTER_ALL = "~"  # sorts after every encoded value


def parse_iso_date(value: str) -> datetime:
    """A strict ISO-8601 date or date-time, in UTC (naive means UTC); ValueError if it is not
    a real date (``2024-13-45``) or has none in UTC (``0001-01-01T00:00+01:00``)."""
    try:
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError as e:
        raise ValueError(f"{value!r} is out of the range of dates in UTC") from e


def _encode_number(value: float) -> str:
    # IEEE-754 bits, sign flipped so that unsigned order is numeric order.
    bits: int = struct.unpack(">Q", struct.pack(">d", float(value) + 0.0))[0]
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63
    return f"{bits:016x}"


def _encode_date(value: str) -> str:
    # The year by hand: strftime's %Y does not pad years below 1000 on Linux, which would
    # sort "999-..." after "2024-...".
    d = parse_iso_date(value)
    return f"{d.year:04d}-" + d.strftime("%m-%dT%H:%M:%S.%f")


def _encode_date_bound(value: str) -> str:
    """A range bound as a date term. A bound shaped like a date but not a real one
    (``2024-02-30``; the schema states the shape only) compares by its text, as the Postgres
    arm compares it: its zero-padded ``YYYY-MM-DD`` places it between the real dates around
    it, so the filter means what it says instead of failing."""
    try:
        return _encode_date(value)
    except ValueError:
        return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def range_terms(metadata: dict[str, Any]) -> list[str]:
    """The ``metadata_ranges`` keywords of a document's metadata."""
    from shared.search.schemas import ISO_DATE

    terms = []
    for key, value in metadata.items():
        for item in value if isinstance(value, list) else [value]:
            if _is_number(item):
                try:
                    terms.append(f"{key}{KEY_END}{NUMBER}{_encode_number(item)}")
                except OverflowError:
                    continue  # an integer no double holds (refused at intake since)
            elif isinstance(item, str) and ISO_DATE.match(item):
                try:
                    terms.append(f"{key}{KEY_END}{DATE}{_encode_date(item)}")
                except ValueError:
                    continue  # stored before dates were checked at intake: no range for it
    return terms


def _es_range(key: str, condition: Range) -> dict[str, Any]:
    kind = DATE if condition.is_date else NUMBER
    prefix = f"{key}{KEY_END}{kind}"
    encode = _encode_date_bound if condition.is_date else _encode_number
    bounds: dict[str, str] = {op: prefix + encode(v) for op, v in condition.bounds().items()}
    if "gt" not in bounds and "gte" not in bounds:
        bounds["gte"] = prefix
    if "lt" not in bounds and "lte" not in bounds:
        bounds["lt"] = prefix + AFTER_ALL
    return {"range": {"metadata_ranges": bounds}}
