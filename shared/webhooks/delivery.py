"""Sending webhook deliveries: claim the due ones (a lease, so two senders never send one
twice at once and a sender that dies leaves them to come due again), POST each outside any
transaction, then record the outcome: delivered on a 2xx answer, else retried after a
jittered, doubling delay (``webhook_backoff_s`` up to ``webhook_backoff_max_s``) until
``webhook_max_attempts``, then failed (kept in the delivery log with its last error)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from shared.db import Transactions
from shared.db.repository import now
from shared.retry import retry_delay
from shared.settings import Settings
from shared.webhooks import repository as repo
from shared.webhooks.signing import SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)
BATCH = 50


@dataclass
class Sent:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {"delivered": self.delivered, "retrying": self.retrying, "failed": self.failed}


def deliver_due(
    transactions: Transactions, settings: Settings, client: httpx.Client | None = None
) -> Sent:
    """Send every delivery that is due now, a batch at a time."""
    sent = Sent()
    lease = timedelta(seconds=settings.webhook_timeout_s * BATCH + 30)
    with client or httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False) as http:
        while True:
            with transactions() as uow:
                claimed = repo.claim_due(uow.session, BATCH, lease)
                batch = [
                    (d.id, d.event, d.payload, d.attempts, url, secret)
                    for d, url, secret in claimed
                ]
            if not batch:
                return sent
            for delivery_id, event, payload, attempts, url, secret in batch:
                status, error = _post(http, url, secret, delivery_id, event, payload)
                _record(transactions, settings, delivery_id, attempts + 1, status, error, sent)
            if len(batch) < BATCH:
                return sent


def _post(
    http: httpx.Client,
    url: str,
    secret: str,
    delivery_id: int,
    event: str,
    payload: dict[str, Any],
) -> tuple[int | None, str | None]:
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "concord-webhooks/1",
        "Concord-Event": event,
        "Concord-Delivery": str(delivery_id),
        SIGNATURE_HEADER: sign(secret, body, int(time.time())),
    }
    try:
        response = http.post(url, content=body, headers=headers)
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}"[:500]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"


def _record(
    transactions: Transactions,
    settings: Settings,
    delivery_id: int,
    attempts: int,
    status: int | None,
    error: str | None,
    sent: Sent,
) -> None:
    with transactions() as uow:
        delivery = repo.delivery(uow.session, delivery_id)
        if delivery is None:  # its endpoint was deleted meanwhile
            return
        at = now(uow.session)
        delivery.attempts = attempts
        delivery.last_status = status
        delivery.last_error = error
        if error is None:
            delivery.state, delivery.delivered_at = "delivered", at
            sent.delivered += 1
        elif attempts >= settings.webhook_max_attempts:
            delivery.state = "failed"
            sent.failed += 1
            log.warning("webhook delivery %s failed for good: %s", delivery_id, error)
        else:
            delay = retry_delay(
                attempts - 1, settings.webhook_backoff_s, settings.webhook_backoff_max_s
            )
            delivery.next_attempt_at = at + timedelta(seconds=delay)
            sent.retrying += 1
