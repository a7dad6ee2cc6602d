"""Field rules every API schema shares: strict models, strings Postgres can store, metadata
keys and ISO-8601 dates (used by the search request's filters, document metadata, tenants and
profiles alike)."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

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


# What a name shown in listings, logs and terminals may not hold: controls (Cc: C0, DEL, C1),
# format characters (Cf: a right-to-left override shows "evil\u202etxt.exe" as
# "evilexe.txt", a zero-width space makes two ids look the same) and line and paragraph
# separators (Zl, Zp): each rewrites or hides what a person reads.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def invisible_character(value: str) -> str | None:
    """Why ``value`` is not a name a person can read ("U+202E RIGHT-TO-LEFT OVERRIDE at
    position 4"), or None."""
    for position, character in enumerate(value):
        if unicodedata.category(character) in INVISIBLE_CATEGORIES:
            name = unicodedata.name(character, "a control character")
            return f"U+{ord(character):04X} {name} at position {position}"
    return None


def _readable(value: str) -> str:
    found = invisible_character(value)
    if found:
        raise ValueError(f"it must not contain control or format characters (found {found})")
    return value


# A name (an id, a title) a person reads: no control, format or separator character.
ReadableName = Annotated[str, AfterValidator(_readable)]
