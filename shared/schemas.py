"""Pieces every domain's response models share."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import PlainSerializer

# A moment as ISO-8601 text with its UTC offset (``2026-12-01T07:33:21.123456+00:00``), as
# Python writes it: what every response has carried.
Timestamp = Annotated[datetime, PlainSerializer(lambda d: d.isoformat(), return_type=str)]
