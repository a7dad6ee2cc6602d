"""Webhooks: a tenant's endpoints, and the events its jobs raise.

An event is written as one delivery per endpoint that wants it, in the same transaction as the
state change it reports (a job indexed, failed or dead-lettered; a training run finished), so
a committed change always has its deliveries and a rolled-back one has none. Sending is
shared/webhooks/delivery.py's, after commit and on a beat."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy.orm import Session

from shared.db import UnitOfWork
from shared.db.repository import lock_key, now
from shared.egress import EgressRefused, Network, check_destination_url
from shared.errors import Conflict, InvalidRequest, NotFound
from shared.models import IngestJob, TrainingJob, WebhookDelivery, WebhookEndpoint
from shared.queue import TaskQueue
from shared.settings import Settings
from shared.tenants import repository as tenants_repo
from shared.webhooks import repository as repo
from shared.webhooks.schemas import CreatedEndpoint, DeliveryView, EndpointView

MAX_ENDPOINTS_PER_TENANT = 20
JOB_EVENTS = {
    "indexed": "job.indexed",
    "failed": "job.failed",
    "dead_lettered": "job.dead_lettered",
}


def create_endpoint(
    session: Session, tenant_id: str, url: str, events: Sequence[str], settings: Settings
) -> CreatedEndpoint:
    check_url(url, settings.webhook_allowed())
    tenants_repo.ensure_tenant(session, tenant_id)
    # Every finished job writes a delivery per endpoint, in its own transaction: bounded.
    lock_key(session, f"webhook-endpoints:{tenant_id}")  # two creates cannot both pass
    if len(repo.endpoints(session, tenant_id)) >= MAX_ENDPOINTS_PER_TENANT:
        raise Conflict(
            f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints: delete one first"
        )
    endpoint = WebhookEndpoint(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        url=url,
        events=sorted(set(events)),
        secret="whsec_" + secrets.token_urlsafe(32),
        created_at=now(session),
    )
    repo.add_endpoint(session, endpoint)
    return CreatedEndpoint(**endpoint_view(endpoint).model_dump(), secret=endpoint.secret)


def check_url(url: str, allowed: Sequence[Network] = ()) -> None:
    """A URL the sender can POST to (http or https, a host, a port in 1-65535) and may
    (shared/egress.py: a literal address or ``localhost`` is judged now, a name again at
    each delivery), or a 422 that says why not: the schema's pattern lets through what only
    the HTTP client can judge."""
    try:
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port
    except (httpx.InvalidURL, ValueError, UnicodeError) as e:  # idna's errors are ValueErrors
        raise InvalidRequest(f"the webhook URL cannot be sent to: {e}") from e
    if parsed.scheme not in ("http", "https") or not host:
        raise InvalidRequest("the webhook URL must be http(s) with a host")
    if port is not None and not 1 <= port <= 65535:
        raise InvalidRequest(f"the webhook URL's port must be 1-65535, not {port}")
    try:
        check_destination_url(parsed, allowed)
    except EgressRefused as e:
        raise InvalidRequest(
            f"the webhook URL may not be sent to, a refused destination ({e}): only public "
            "addresses, or the networks an operator allows with CONCORD_WEBHOOK_ALLOWED_NETWORKS"
        ) from e


def list_endpoints(session: Session, tenant_id: str) -> list[EndpointView]:
    return [endpoint_view(e) for e in repo.endpoints(session, tenant_id)]


def delete_endpoint(session: Session, tenant_id: str, endpoint_id: uuid.UUID) -> None:
    repo.delete_endpoint(session, _endpoint(session, tenant_id, endpoint_id))


def delivery_log(
    session: Session, tenant_id: str, endpoint_id: uuid.UUID, limit: int
) -> list[DeliveryView]:
    """The endpoint's deliveries, newest first."""
    _endpoint(session, tenant_id, endpoint_id)
    return [delivery_view(d) for d in repo.deliveries(session, endpoint_id, limit)]


def job_finished(uow: UnitOfWork, jobs: Sequence[IngestJob], *, queue: TaskQueue) -> None:
    """The events of jobs that reached a final state in this transaction, each naming its
    document by external id too (what the tenant's own systems know it by)."""
    finished = [j for j in jobs if str(j.state) in JOB_EVENTS]
    names = repo.external_ids(uow.session, [j.document_id for j in finished])
    emit(uow, [(j.tenant_id, JOB_EVENTS[str(j.state)], job_payload(j, names.get(j.document_id)))
               for j in finished], queue=queue)  # fmt: skip


def training_finished(uow: UnitOfWork, job: TrainingJob, *, queue: TaskQueue) -> None:
    event = "training.finished" if job.state == "done" else "training.failed"
    emit(
        uow,
        [
            (
                job.tenant_id,
                event,
                {
                    "event": event,
                    "tenant_id": job.tenant_id,
                    "training_job_id": str(job.id),
                    "name": job.name,
                    "state": job.state,
                    "error": job.error,
                },
            )
        ],
        queue=queue,
    )


def emit(
    uow: UnitOfWork, events: Sequence[tuple[str, str, dict[str, Any]]], *, queue: TaskQueue
) -> None:
    """Deliveries for ``events`` (tenant, event, payload), sent once this transaction commits."""
    if repo.add_deliveries(uow.session, events):
        uow.after_commit(queue.publish_webhooks)


def job_payload(job: IngestJob, external_id: str | None = None) -> dict[str, Any]:
    error = (
        {"stage": job.error_stage, "class": job.error_class, "message": job.error_message}
        if job.error_message
        else None
    )
    return {
        "event": JOB_EVENTS[str(job.state)],
        "tenant_id": job.tenant_id,
        "job_id": str(job.id),
        "document_id": str(job.document_id),
        "external_id": external_id,
        "version": job.version,
        "state": str(job.state),
        "attempts": job.attempts,
        "error": error,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def endpoint_view(e: WebhookEndpoint) -> EndpointView:
    return EndpointView(id=e.id, url=e.url, events=list(e.events), created_at=e.created_at)


def delivery_view(d: WebhookDelivery) -> DeliveryView:
    return DeliveryView(
        id=d.id,
        event=d.event,
        state=d.state,  # type: ignore[arg-type]
        attempts=d.attempts,
        last_status=d.last_status,
        last_error=d.last_error,
        created_at=d.created_at,
        next_attempt_at=d.next_attempt_at if d.state == "pending" else None,
        delivered_at=d.delivered_at,
        payload=d.payload,
    )


def _endpoint(session: Session, tenant_id: str, endpoint_id: uuid.UUID) -> WebhookEndpoint:
    found = repo.endpoint(session, tenant_id, endpoint_id)
    if found is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return found
