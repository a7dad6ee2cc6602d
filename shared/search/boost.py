"""The metadata boost (``boost`` in a search request): applied to the fused ranking, once for
every candidate whichever arm found it, before hydration picks the results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shared.search.schemas import Boost


def boosted(
    fused: list[tuple[str, float]], values: Mapping[str, Any], boost: Boost, now: datetime
) -> list[tuple[str, float]]:
    """``fused`` with weight x f(value) x the spread of the fused scores added to each score,
    re-sorted (stable: ties keep the fused order). Added, not multiplied, so that it lifts
    whatever the scores' sign and scale (a z-scored convex fusion has negative scores; a
    min-max one a zero): at weight 1 a value with f = 1 is worth the whole spread between the
    first and the last candidate."""
    if not fused:
        return fused
    factors = _factors(values, boost, now)
    scores = [score for _, score in fused]
    spread = (max(scores) - min(scores)) or abs(scores[0]) or 1.0
    lift = boost.weight * spread
    rescored = [(cid, score + lift * factors.get(cid, 0.0)) for cid, score in fused]
    return sorted(rescored, key=lambda hit: -hit[1])


def _factors(values: Mapping[str, Any], boost: Boost, now: datetime) -> dict[str, float]:
    if boost.kind == "recency":
        factors = {}
        for cid, value in values.items():
            when = _date(value)
            if when is not None:
                age_days = max(0.0, (now - when).total_seconds() / 86400)
                factors[cid] = 0.5 ** (age_days / boost.half_life_days)
        return factors
    numbers = {
        cid: float(v)
        for cid, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if not numbers:
        return {}
    low, high = min(numbers.values()), max(numbers.values())
    if high == low:
        return dict.fromkeys(numbers, 1.0)
    return {cid: (v - low) / (high - low) for cid, v in numbers.items()}


def _date(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
