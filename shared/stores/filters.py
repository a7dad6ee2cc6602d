"""The search request's filters: one model, three translations, SQL conditions on chunks
(pgvector arm), Elasticsearch ``bool.filter`` clauses (BM25 arm) and a Python predicate (the
in-memory stores, shared/stores/memory/), with the same meaning in all. They live with the
stores that run them; the search request (shared/search/schemas.py) and the API take the
model from here.

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
import operator
import struct
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, model_validator
from sqlalchemy import ColumnElement, Numeric, and_, case, cast, func, or_

from shared.fields import ISO_DATE, NO_NUL, STRICT, MetadataKey, Strict, parse_iso_date
from shared.models import Chunk

# A filter value longer than a document's whole metadata may be (MAX_METADATA_BYTES of
# shared/documents/schemas.py) could never match.
MAX_FILTER_VALUE_CHARS = 16 * 1024
Text = Annotated[str, StringConstraints(pattern=NO_NUL, max_length=MAX_FILTER_VALUE_CHARS)]
Scalar = Text | int | float | bool
MAX_FILTERS = 20
MAX_IN_VALUES = 100


BOUNDS = ("gt", "gte", "lt", "lte")


def _range_variant(value_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {bound: value_schema for bound in BOUNDS},
        "additionalProperties": False,
        "minProperties": 1,
    }


def _range_schema(schema: dict[str, Any]) -> None:
    schema.clear()
    schema["anyOf"] = [
        _range_variant({"type": "number"}),
        _range_variant({"type": "string", "pattern": ISO_DATE.pattern}),
    ]


# An ISO-8601 date or timestamp is far shorter; the pattern alone would take any length.
DateText = Annotated[str, StringConstraints(max_length=64)]


class Range(Strict):
    """Bounds that are all numbers or all ISO-8601 dates (the OpenAPI document says so too)."""

    model_config = ConfigDict(**STRICT, json_schema_extra=lambda schema, _: _range_schema(schema))

    gt: float | DateText | None = None
    gte: float | DateText | None = None
    lt: float | DateText | None = None
    lte: float | DateText | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_null_bounds(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(data.get(b, 0) is None for b in BOUNDS):
            raise ValueError("range bounds must not be null; leave the bound out instead")
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Range:
        bounds = [v for v in (self.gt, self.gte, self.lt, self.lte) if v is not None]
        if not bounds:
            raise ValueError("a range needs at least one of gt, gte, lt, lte")
        numbers = all(isinstance(v, int | float) for v in bounds)
        dates = all(isinstance(v, str) and ISO_DATE.match(v) for v in bounds)
        if not (numbers or dates):
            raise ValueError("range bounds must be all numbers or all ISO-8601 dates")
        return self

    @property
    def is_date(self) -> bool:
        return any(isinstance(v, str) for v in (self.gt, self.gte, self.lt, self.lte))

    def bounds(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


MetadataCondition = (
    Scalar | Annotated[list[Scalar], Field(min_length=1, max_length=MAX_IN_VALUES)] | Range
)


class Filters(Strict):
    # Key names and counts are in the types, so the OpenAPI document states them too.
    metadata: dict[MetadataKey, MetadataCondition] = Field(
        default_factory=dict,
        max_length=MAX_FILTERS,
        description="conditions on document metadata, all of which must hold: per key a value "
        "(equal), a list of values (any of them), or a range {gt, gte, lt, lte} of numbers or "
        "of ISO-8601 dates",
        # patternProperties alone would let other names through in the document's eyes
        json_schema_extra={"additionalProperties": False},
    )
    # JSON has no UUID type: ids come as strings, so this one field is parsed leniently.
    document_ids: list[Annotated[uuid.UUID, Field(strict=False)]] | None = Field(
        default=None, min_length=1, max_length=1000, description="only these documents' chunks"
    )

    def is_empty(self) -> bool:
        return not self.metadata and not self.document_ids


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


def passes(filters: Filters | None, metadata: Mapping[str, Any], document_id: str) -> bool:
    """Whether a chunk passes ``filters`` as Postgres reads them (shared/stores/filters.py):
    equality and IN compare JSON values (true is not 1), a range holds for a number (or an
    ISO-8601 date, compared as text) within its bounds, and a key missing never matches."""
    if filters is None:
        return True
    if filters.document_ids and uuid.UUID(document_id) not in filters.document_ids:
        return False
    for key, condition in filters.metadata.items():
        if key not in metadata:
            return False
        value = metadata[key]
        if isinstance(condition, Range):
            if not _in_range(value, condition):
                return False
        elif isinstance(condition, list):
            if not any(_same_json(value, wanted) for wanted in condition):
                return False
        elif not _same_json(value, condition):
            return False
    return True


def _same_json(value: Any, wanted: Any) -> bool:
    return isinstance(value, bool) == isinstance(wanted, bool) and value == wanted


def _in_range(value: Any, condition: Range) -> bool:
    if condition.is_date:
        if not isinstance(value, str):
            return False
    elif not isinstance(value, int | float) or isinstance(value, bool):
        return False
    compare = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}
    return all(compare[op](value, bound) for op, bound in condition.bounds().items())
