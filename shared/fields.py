"""Field rules every API schema shares: strict models, strings Postgres can store, metadata
keys and ISO-8601 dates (used by the search request's filters, document metadata, tenants and
profiles alike)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

# Postgres text and JSONB cannot hold NUL: a string with one is invalid input, not a 500.
NO_NUL = r"^[^\x00]*$"
METADATA_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MetadataKey = Annotated[str, StringConstraints(pattern=METADATA_KEY.pattern)]
ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9:.]+(Z|[+-][0-9]{2}:?[0-9]{2})?)?$")


# Unknown fields are errors, and so are values of the wrong JSON type (``"explain": 0`` or
# ``"top_k": true`` are not quietly coerced). Python's JSON parser reads the non-standard
# NaN and Infinity: refused too (a NaN weight or filter value has no meaning, and Postgres'
# JSONB refuses one).
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Strict(BaseModel):
    model_config = STRICT


def parse_iso_date(value: str) -> datetime:
    """A strict ISO-8601 date or date-time, in UTC (naive means UTC); ValueError if it is not
    a real date (``2024-13-45``) or has none in UTC (``0001-01-01T00:00+01:00``)."""
    try:
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError as e:
        raise ValueError(f"{value!r} is out of the range of dates in UTC") from e
