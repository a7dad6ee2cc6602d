"""Every SQL statement of the webhook tables."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from shared.models import Document, WebhookDelivery, WebhookEndpoint


def external_ids(session: Session, document_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """document id -> its external id, for the documents of a batch of job events."""
    if not document_ids:
        return {}
    rows = session.execute(
        select(Document.id, Document.external_id).where(Document.id.in_(set(document_ids)))
    )
    return {document_id: external_id for document_id, external_id in rows}


def add_endpoint(session: Session, endpoint: WebhookEndpoint) -> None:
    session.add(endpoint)
    session.flush()


def endpoints(session: Session, tenant_id: str) -> list[WebhookEndpoint]:
    return list(
        session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.tenant_id == tenant_id)
            .order_by(WebhookEndpoint.created_at)
        )
    )


def endpoint(session: Session, tenant_id: str, endpoint_id: uuid.UUID) -> WebhookEndpoint | None:
    return session.scalar(
        select(WebhookEndpoint).where(
            WebhookEndpoint.id == endpoint_id, WebhookEndpoint.tenant_id == tenant_id
        )
    )


def delete_endpoint(session: Session, row: WebhookEndpoint) -> None:
    session.delete(row)
    session.flush()


def add_deliveries(session: Session, events: Sequence[tuple[str, str, dict[str, Any]]]) -> int:
    """A delivery for every (tenant, event, payload) and every endpoint of that tenant that
    wants the event, in one statement whatever the count; returns how many were added."""
    if not events:
        return 0
    rows = [{"tenant_id": t, "event": e, "payload": p} for t, e, p in events]
    result = session.execute(
        text(
            "INSERT INTO webhook_deliveries (endpoint_id, tenant_id, event, payload, state) "
            "SELECT e.id, e.tenant_id, v.event, v.payload, 'pending' "
            "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) "
            "AS v(tenant_id text, event text, payload jsonb) "
            "JOIN webhook_endpoints e ON e.tenant_id = v.tenant_id AND v.event = ANY(e.events)"
        ),
        {"rows": json.dumps(rows)},
    )
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True)
class Due:
    """A delivery that is due, with what fair claiming needs to know of it."""

    id: int
    tenant_id: str
    endpoint_id: uuid.UUID
    endpoint_failing: bool  # its endpoint failed its last attempts (parked, now probed)


def due_deliveries(
    session: Session, per_endpoint: int, exclude_endpoints: Sequence[uuid.UUID], limit: int
) -> list[Due]:
    """Due pending deliveries, at most ``per_endpoint`` of each endpoint, in round-robin
    order over endpoints (each endpoint's oldest first, then each one's second, ...). Not
    locked: :func:`claim` takes those the sender chooses. A parked endpoint's deliveries are
    not due (parking moves them to the end of its parking)."""
    ranked = (
        select(
            WebhookDelivery.id,
            WebhookDelivery.tenant_id,
            WebhookDelivery.endpoint_id,
            WebhookDelivery.next_attempt_at,
            func.row_number()
            .over(
                partition_by=WebhookDelivery.endpoint_id,
                order_by=(WebhookDelivery.next_attempt_at, WebhookDelivery.id),
            )
            .label("turn"),
        )
        .where(
            WebhookDelivery.state == "pending",
            WebhookDelivery.next_attempt_at <= func.now(),
            WebhookDelivery.endpoint_id.not_in(list(exclude_endpoints)),
        )
        .subquery()
    )
    rows = session.execute(
        select(
            ranked.c.id,
            ranked.c.tenant_id,
            ranked.c.endpoint_id,
            WebhookEndpoint.consecutive_failures > 0,
        )
        .join(WebhookEndpoint, WebhookEndpoint.id == ranked.c.endpoint_id)
        .where(ranked.c.turn <= per_endpoint)
        .order_by(ranked.c.turn, ranked.c.next_attempt_at, ranked.c.id)
        .limit(limit)
    ).all()
    return [Due(i, t, e, bool(failing)) for i, t, e, failing in rows]


def claim(
    session: Session, delivery_ids: Sequence[int], lease: timedelta
) -> list[tuple[WebhookDelivery, str, str]]:
    """Of ``delivery_ids``, those still due and not being claimed by another sender, with
    their endpoint's URL and secret, claimed for ``lease`` (their next attempt moved past it,
    so no other sender takes them while this one tries; should it die, they come due again)."""
    if not delivery_ids:
        return []
    still_due = (
        select(WebhookDelivery.id)
        .where(
            WebhookDelivery.id.in_(list(delivery_ids)),
            WebhookDelivery.state == "pending",
            WebhookDelivery.next_attempt_at <= func.now(),
        )
        .with_for_update(skip_locked=True)
    )
    claimed = (
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id.in_(still_due.scalar_subquery()))
            .values(next_attempt_at=func.now() + lease)
            .returning(WebhookDelivery.id)
        )
        .scalars()
        .all()
    )
    if not claimed:
        return []
    rows = session.execute(
        select(WebhookDelivery, WebhookEndpoint.url, WebhookEndpoint.secret)
        .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
        .where(WebhookDelivery.id.in_(claimed))
        .order_by(WebhookDelivery.id)
    ).all()
    return [(delivery, url, secret) for delivery, url, secret in rows]


def locked_endpoint(session: Session, endpoint_id: uuid.UUID) -> WebhookEndpoint | None:
    return session.get(WebhookEndpoint, endpoint_id, with_for_update=True)


def park_deliveries(session: Session, endpoint_id: uuid.UUID, until: datetime) -> None:
    """The endpoint's pending deliveries wait until ``until`` (none of their attempts is
    counted: they were never tried)."""
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.state == "pending")
        .values(next_attempt_at=func.greatest(WebhookDelivery.next_attempt_at, until))
    )


def delivery(session: Session, delivery_id: int) -> WebhookDelivery | None:
    return session.get(WebhookDelivery, delivery_id, with_for_update=True)


def deliveries(session: Session, endpoint_id: uuid.UUID, limit: int) -> list[WebhookDelivery]:
    return list(
        session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == endpoint_id)
            .order_by(WebhookDelivery.id.desc())
            .limit(limit)
        )
    )


def release(session: Session, delivery_ids: Sequence[int], delay: timedelta) -> None:
    """Hand claimed deliveries back, due after ``delay``, without counting an attempt."""
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(list(delivery_ids)), WebhookDelivery.state == "pending")
        .values(next_attempt_at=func.now() + delay)
    )
