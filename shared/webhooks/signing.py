"""How a webhook delivery is signed, and how a receiver checks it (replay-safe).

Each delivery carries ``Concord-Signature: t=<unix seconds>,v1=<hex>``, where ``v1`` is
HMAC-SHA256 with the endpoint's secret over ``"<t>.<body>"``. A receiver recomputes it over
the raw body, compares in constant time, and refuses a timestamp older than its tolerance (so
a captured delivery cannot be replayed later); ``Concord-Delivery`` (the delivery id) lets it
drop a retry it already processed."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Concord-Signature"
DEFAULT_TOLERANCE_S = 300


def sign(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(
    secret: str,
    header: str,
    body: bytes,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance_s`` of now."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)
