"""Sending webhook deliveries, fairly between tenants and safely for the machine.

A run (on the ``webhooks`` queue: a worker of its own, so no receiver can hold up the outbox
relay or the sweep) keeps up to ``webhook_concurrency`` requests in flight at once, claiming
due deliveries as slots free up, with at most ``webhook_tenant_in_flight`` of one tenant and
``webhook_endpoint_in_flight`` of one endpoint among them: a tenant whose endpoints hang
holds its own slots, never another tenant's.

Each request goes through the egress rule (shared/egress.py: no loopback, private or
link-local address, the resolved address is the one connected to) and takes at most
``webhook_timeout_s`` from connecting to the last byte (a receiver that trickles its answer a
byte at a time cannot hold a slot). A 2xx answer delivers; anything else is retried after a
jittered, doubling delay (``webhook_backoff_s`` up to ``webhook_backoff_max_s``) until
``webhook_max_attempts``, then failed. The delivery log keeps the status code and Concord's
own classification of a failure, never the receiver's body (a tenant would otherwise read
internal services' answers back through it).

The circuit breaker: an endpoint that fails ``webhook_breaker_failures`` attempts in a row is
parked for ``webhook_breaker_park_s`` (doubling with each further failure, up to
``webhook_backoff_max_s``): its pending deliveries wait out the parking without losing an
attempt, then one of them probes it. An endpoint that fails once is not tried again in the
same run. A run sends for at most ``webhook_run_budget_s``; a run never outlives its claims'
lease, and an outcome is recorded only on a delivery still pending."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.db.repository import now
from shared.egress import CheckedTransport, EgressRefused
from shared.retry import retry_delay
from shared.settings import Settings
from shared.webhooks import repository as repo
from shared.webhooks.signing import DELIVERY_HEADER, SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)
POLL_S = 0.25  # while requests are in flight, how often newly due deliveries are looked for


@dataclass
class Sent:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    parked: int = 0  # endpoints the breaker parked in this run

    def as_dict(self) -> dict[str, int]:
        return vars(self).copy()


@dataclass(frozen=True)
class Attempt:
    """One claimed delivery, as the sender needs it outside any transaction."""

    id: int
    tenant_id: str
    endpoint_id: uuid.UUID
    event: str
    payload: dict[str, Any]
    attempts: int
    url: str
    secret: str


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the receiver's HTTP status, where it answered
    error: str | None  # Concord's classification of a failure; None: delivered


@dataclass
class _InFlight:
    """What the run is sending now, counted per tenant and per endpoint."""

    tasks: dict[asyncio.Task[Outcome], Attempt] = field(default_factory=dict)
    tenants: Counter[str] = field(default_factory=Counter)
    endpoints: Counter[uuid.UUID] = field(default_factory=Counter)

    def add(self, attempt: Attempt, task: asyncio.Task[Outcome]) -> None:
        self.tasks[task] = attempt
        self.tenants[attempt.tenant_id] += 1
        self.endpoints[attempt.endpoint_id] += 1

    def pop(self, task: asyncio.Task[Outcome]) -> Attempt:
        attempt = self.tasks.pop(task)
        self.tenants[attempt.tenant_id] -= 1
        self.endpoints[attempt.endpoint_id] -= 1
        return attempt


def lease_for(settings: Settings) -> timedelta:
    # The budget, then the one request that may have started just before it ran out (at
    # most the timeout, all of it), and a margin.
    return timedelta(seconds=settings.webhook_run_budget_s + settings.webhook_timeout_s + 30)


def deliver_due(transactions: Transactions, settings: Settings) -> Sent:
    """Send the deliveries that are due now, and those that come due while this run lasts,
    within the run's budget."""
    return asyncio.run(_deliver_due(transactions, settings))


async def _deliver_due(transactions: Transactions, settings: Settings) -> Sent:
    sent = Sent()
    deadline = time.monotonic() + settings.webhook_run_budget_s
    flight = _InFlight()
    failed_endpoints: set[uuid.UUID] = set()
    async with httpx.AsyncClient(
        transport=CheckedTransport(settings.webhook_allowed()),
        timeout=settings.webhook_timeout_s,
        follow_redirects=False,
        trust_env=False,
    ) as http:
        while True:
            if time.monotonic() < deadline:
                for attempt in await asyncio.to_thread(
                    _claim, transactions, settings, flight, failed_endpoints
                ):
                    task = asyncio.create_task(_post(http, settings, attempt))
                    flight.add(attempt, task)
            if not flight.tasks:
                return sent
            done, _ = await asyncio.wait(
                flight.tasks, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED
            )
            finished = [(flight.pop(task), task.result()) for task in done]
            for attempt, outcome in finished:
                if outcome.error is not None:
                    failed_endpoints.add(attempt.endpoint_id)
            if finished:
                await asyncio.to_thread(_record, transactions, settings, finished, sent)


def _claim(
    transactions: Transactions,
    settings: Settings,
    flight: _InFlight,
    failed_endpoints: set[uuid.UUID],
) -> list[Attempt]:
    """Due deliveries for the free slots, round-robin over endpoints and within each
    tenant's and endpoint's share; an endpoint being probed after parking gets one."""
    free = settings.webhook_concurrency - len(flight.tasks)
    if free <= 0:
        return []
    per_endpoint = settings.webhook_endpoint_in_flight
    full = {e for e, n in flight.endpoints.items() if n >= per_endpoint}
    tenants = Counter(flight.tenants)
    endpoints = Counter(flight.endpoints)
    chosen = []
    with transactions() as uow:
        for due in repo.due_deliveries(
            uow.session, per_endpoint, sorted(failed_endpoints | full), limit=free * 8
        ):
            endpoint_cap = 1 if due.endpoint_failing else per_endpoint
            if (
                tenants[due.tenant_id] >= settings.webhook_tenant_in_flight
                or endpoints[due.endpoint_id] >= endpoint_cap
            ):
                continue
            tenants[due.tenant_id] += 1
            endpoints[due.endpoint_id] += 1
            chosen.append(due.id)
            if len(chosen) == free:
                break
        claimed = repo.claim(uow.session, chosen, lease_for(settings))
        return [
            Attempt(d.id, d.tenant_id, d.endpoint_id, d.event, d.payload, d.attempts, url, secret)
            for d, url, secret in claimed
        ]


async def _post(http: httpx.AsyncClient, settings: Settings, attempt: Attempt) -> Outcome:
    """Send one delivery. Every failure to send is an outcome to record, never an
    exception, so one endpoint cannot stop the deliveries beside it."""
    body = json.dumps(attempt.payload, separators=(",", ":"), sort_keys=True).encode()
    delivery_id = str(attempt.id)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "concord-webhooks/1",
        "Concord-Event": attempt.event,
        DELIVERY_HEADER: delivery_id,
        SIGNATURE_HEADER: sign(attempt.secret, body, int(time.time()), delivery_id),
    }
    limit = settings.webhook_timeout_s
    try:
        status = await asyncio.wait_for(_exchange(http, attempt.url, body, headers), limit)
    except TimeoutError:
        return Outcome(None, f"timeout: no complete answer within {limit:g} s")
    except Exception as e:
        return Outcome(None, classify(e))
    if 200 <= status < 300:
        return Outcome(status, None)
    return Outcome(status, f"http_status: the receiver answered {status}")


async def _exchange(http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST; the status. The answer's body is read (so that the connection ends cleanly)
    up to a few KiB and thrown away: nothing of it is stored."""
    async with http.stream("POST", url, content=body, headers=headers) as response:
        read = 0
        async for piece in response.aiter_bytes():
            read += len(piece)
            if read >= 4096:
                break
        return response.status_code


def classify(error: Exception) -> str:
    """Concord's own words for a failed attempt: what went wrong on our side of the
    connection, never text the receiver chose."""
    if isinstance(error, EgressRefused):  # its message says no address and no name
        return f"refused_destination: {error}"
    if isinstance(error, httpx.TimeoutException):
        return "timeout: the receiver did not answer in time"
    if isinstance(error, httpx.ConnectError):
        return "connect_failed: no connection could be made"
    if isinstance(error, httpx.InvalidURL | httpx.UnsupportedProtocol):
        return "invalid_url: the URL cannot be sent to"
    if isinstance(error, httpx.TransportError):
        return f"transport_error: {type(error).__name__}"
    return f"send_error: {type(error).__name__}"


def _record(
    transactions: Transactions,
    settings: Settings,
    finished: list[tuple[Attempt, Outcome]],
    sent: Sent,
) -> None:
    with transactions() as uow:
        at = now(uow.session)
        for attempt, outcome in finished:
            parked_until = _record_endpoint(uow.session, settings, attempt, outcome, at, sent)
            delivery = repo.delivery(uow.session, attempt.id)
            if delivery is None or delivery.state != "pending":  # deleted, or settled meanwhile
                continue
            delivery.attempts = attempt.attempts + 1
            delivery.last_status = outcome.status
            delivery.last_error = outcome.error
            if outcome.error is None:
                delivery.state, delivery.delivered_at = "delivered", at
                sent.delivered += 1
            elif delivery.attempts >= settings.webhook_max_attempts:
                delivery.state = "failed"
                sent.failed += 1
                log.warning("webhook delivery %s failed for good: %s", attempt.id, outcome.error)
            else:
                delay = retry_delay(
                    delivery.attempts - 1,
                    settings.webhook_backoff_s,
                    settings.webhook_backoff_max_s,
                )
                delivery.next_attempt_at = max(at + timedelta(seconds=delay), parked_until or at)
                sent.retrying += 1


def _record_endpoint(
    session: Session,
    settings: Settings,
    attempt: Attempt,
    outcome: Outcome,
    at: datetime,
    sent: Sent,
) -> datetime | None:
    """The breaker: a success closes it; enough failures in a row park the endpoint (until
    the time returned, which its deliveries wait for)."""
    endpoint = repo.locked_endpoint(session, attempt.endpoint_id)
    if endpoint is None:
        return None
    if outcome.error is None:
        endpoint.consecutive_failures, endpoint.parked_until = 0, None
        return None
    endpoint.consecutive_failures += 1
    beyond = endpoint.consecutive_failures - settings.webhook_breaker_failures
    if beyond < 0:
        return endpoint.parked_until
    park_s = min(settings.webhook_backoff_max_s, settings.webhook_breaker_park_s * 2**beyond)
    endpoint.parked_until = at + timedelta(seconds=park_s)
    repo.park_deliveries(session, endpoint.id, endpoint.parked_until)
    sent.parked += 1
    log.warning(
        "webhook endpoint %s parked for %.0f s after %d failures in a row",
        endpoint.id,
        park_s,
        endpoint.consecutive_failures,
    )
    return endpoint.parked_until
