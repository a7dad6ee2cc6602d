"""Sending webhook deliveries: claim the due ones (a lease, so two senders never send one
twice at once and a sender that dies leaves them to come due again), POST each outside any
transaction, then record the outcome: delivered on a 2xx answer, else retried after a
jittered, doubling delay (``webhook_backoff_s`` up to ``webhook_backoff_max_s``) until
``webhook_max_attempts``, then failed (kept in the delivery log with its last error).

One run sends for at most ``webhook_run_budget_s`` (the relay worker that runs it also drains
the Elasticsearch outbox), and an endpoint that fails once is not tried again in the same run:
a receiver that hangs costs one timeout per run, not one per pending delivery. One request,
from connecting to the last byte read, takes at most ``webhook_timeout_s`` in all: a receiver
that trickles its answer a byte at a time cannot hold the worker (a per-read timeout alone
would let it, for as long as it keeps trickling). Deliveries left
over go back to the queue untouched. A run never outlives its lease (budget plus one request's
worst case), and an outcome is recorded only on a delivery still pending."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx

from shared.db import Transactions
from shared.db.repository import now
from shared.retry import retry_delay
from shared.settings import Settings
from shared.text import storable_text
from shared.webhooks import repository as repo
from shared.webhooks.signing import SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)
BATCH = 50
ANSWER_BYTES = 512  # of a receiver's answer kept for the log (never the whole body)


@dataclass
class Sent:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    deferred: int = 0  # not tried: the run's budget was spent, or their endpoint failed

    def as_dict(self) -> dict[str, int]:
        return vars(self).copy()


def lease_for(settings: Settings) -> timedelta:
    # The budget, then the one request that may have started just before it ran out (at
    # most the timeout, all of it), and a margin.
    return timedelta(seconds=settings.webhook_run_budget_s + settings.webhook_timeout_s + 30)


def deliver_due(transactions: Transactions, settings: Settings) -> Sent:
    """Send the deliveries that are due now, a batch at a time, within the run's budget."""
    sent = Sent()
    deadline = time.monotonic() + settings.webhook_run_budget_s
    failed_endpoints: set[uuid.UUID] = set()
    while time.monotonic() < deadline:
        with transactions() as uow:
            claimed = repo.claim_due(uow.session, BATCH, lease_for(settings))
            batch = [
                (d.id, d.endpoint_id, d.event, d.payload, d.attempts, url, secret)
                for d, url, secret in claimed
            ]
        if not batch:
            break
        deferred = []
        for delivery_id, endpoint_id, event, payload, attempts, url, secret in batch:
            if endpoint_id in failed_endpoints or time.monotonic() >= deadline:
                deferred.append(delivery_id)
                continue
            status, error = _post(settings, url, secret, delivery_id, event, payload)
            if error is not None:
                failed_endpoints.add(endpoint_id)
            _record(transactions, settings, delivery_id, attempts + 1, status, error, sent)
        if deferred:
            with transactions() as uow:
                repo.release(uow.session, deferred, timedelta(seconds=settings.webhook_backoff_s))
            sent.deferred += len(deferred)
        if len(batch) < BATCH:
            break
    return sent


def _post(
    settings: Settings,
    url: str,
    secret: str,
    delivery_id: int,
    event: str,
    payload: dict[str, Any],
) -> tuple[int | None, str | None]:
    """(HTTP status, error or None): any failure to send is an error to record, never an
    exception, so one endpoint cannot stop the deliveries after it. The error is storable
    text: it quotes the receiver's answer, which may hold anything (a NUL, say)."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "concord-webhooks/1",
        "Concord-Event": event,
        "Concord-Delivery": str(delivery_id),
        SIGNATURE_HEADER: sign(secret, body, int(time.time())),
    }
    limit = settings.webhook_timeout_s
    try:
        status, answer = asyncio.run(asyncio.wait_for(_exchange(url, body, headers, limit), limit))
    except TimeoutError:
        return None, f"no complete answer within {limit:g} s"
    except Exception as e:  # a bad URL, a refused or reset connection, ...
        return None, storable_text(f"{type(e).__name__}: {e}"[:500])
    if 200 <= status < 300:
        return status, None
    return status, storable_text(f"HTTP {status}: {answer[:200].decode(errors='replace')}")


async def _exchange(
    url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, bytes]:
    """POST; the status and the start of a refusal's answer (never the whole body)."""
    async with (
        httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as http,
        http.stream("POST", url, content=body, headers=headers) as response,
    ):
        answer = b""
        if not 200 <= response.status_code < 300:
            async for piece in response.aiter_bytes():
                answer += piece
                if len(answer) >= ANSWER_BYTES:
                    break
        return response.status_code, answer


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
        if delivery is None or delivery.state != "pending":  # deleted, or settled meanwhile
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
