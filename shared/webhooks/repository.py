"""Every SQL statement of the webhook tables."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from shared.models import WebhookDelivery, WebhookEndpoint


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


def claim_due(
    session: Session, limit: int, lease: timedelta
) -> list[tuple[WebhookDelivery, str, str]]:
    """Up to ``limit`` pending deliveries that are due, with their endpoint's URL and secret,
    claimed for ``lease`` (their next attempt moved past it, so no other sender takes them
    while this one tries; should it die, they come due again)."""
    due = (
        select(WebhookDelivery.id)
        .where(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= func.now())
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    claimed = (
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id.in_(due.scalar_subquery()))
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
