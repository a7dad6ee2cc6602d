"""How a webhook delivery is signed, and how a receiver checks it (replay-safe).

Each delivery carries ``Concord-Delivery: <id>`` and ``Concord-Signature: t=<unix
seconds>,v2=<hex>``, where ``v2`` is HMAC-SHA256 with the endpoint's secret over
``"<t>.<id>.<body>"``. A receiver recomputes it over the raw body and the delivery id it was
sent, compares in constant time, refuses a timestamp older than its tolerance (a captured
delivery cannot be replayed later) and drops an id it already processed (a retry, or a replay
within the tolerance: the id is signed, so it cannot be changed to pass as a new delivery).

The previous form, ``v1`` over ``"<t>.<body>"``, left the id out of the signature; Concord no
longer sends it. :func:`verify` still accepts it for one release so that receivers can move
to ``v2`` first; it will be removed in the next one."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Concord-Signature"
DELIVERY_HEADER = "Concord-Delivery"
DEFAULT_TOLERANCE_S = 300


def _mac(secret: str, signed: bytes) -> str:
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int, delivery_id: str) -> str:
    """The ``Concord-Signature`` header of a delivery."""
    return f"t={timestamp},v2={_mac(secret, f'{timestamp}.{delivery_id}.'.encode() + body)}"


def verify(
    secret: str,
    header: str,
    body: bytes,
    delivery_id: str | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs ``body`` (and ``delivery_id``, the ``Concord-Delivery``
    header sent with it) with ``secret``, within ``tolerance_s`` of now. A ``v2`` signature
    needs the delivery id; a legacy ``v1`` one (deprecated) is checked without it."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    if "v2" in parts:
        if delivery_id is None:
            return False
        expected = _mac(secret, f"{timestamp}.{delivery_id}.".encode() + body)
        return hmac.compare_digest(expected, parts["v2"])
    if "v1" in parts:  # deprecated: remove in the next release
        return hmac.compare_digest(_mac(secret, f"{timestamp}.".encode() + body), parts["v1"])
    return False
