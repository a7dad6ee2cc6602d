"""Admin endpoints: the operator commands of the CLI over HTTP (scope ``admin``), each scoped
to the key's own tenant. An admin key administers its tenant, never another: work across
tenants (every tenant's reconcile, keys for a new tenant) is the operator's CLI's."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from services.api.deps import (
    API_KEY_LIMIT,
    NOT_REPLAYABLE,
    PROTECTED_ROUTE_ERRORS,
    WEBHOOK_ENDPOINT_LIMIT,
    Admin,
    SettingsDep,
    StoresDep,
)
from shared.admin import service as ops
from shared.admin.schemas import (
    Discarded,
    ReconcileReportView,
    ReconcileResult,
    ReconcileRunView,
    Replayed,
    Stats,
)
from shared.db import unit_of_work
from shared.errors import NotFound
from shared.jobs import service as jobs
from shared.jobs.schemas import DeadLetterView, JobRow
from shared.models import JobState
from shared.reconcile.service import reconcile, reconcile_and_verify
from shared.tenants.schemas import CreatedKey, KeyRequest, KeyView
from shared.tenants.service import create_key, forget_key, list_keys, revoke_key
from shared.webhooks import service as webhooks
from shared.webhooks.schemas import CreatedEndpoint, DeliveryView, EndpointRequest, EndpointView

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=PROTECTED_ROUTE_ERRORS)
LetterId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class ReconcileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repair: StrictBool = Field(
        default=False,
        description="queue repairs for the drift found, then compare again; false: a dry run",
    )


@router.post("/reconcile", response_model_exclude_unset=True)
async def reconcile_route(
    body: ReconcileRequest, principal: Admin, stores: StoresDep
) -> ReconcileResult:
    """Compare this tenant's chunks in Postgres and Elasticsearch; with ``repair``, fix the
    drift and verify."""
    tenant = principal.tenant_id
    if not body.repair:
        report = await run_in_threadpool(reconcile, stores, unit_of_work, tenant)
        return ReconcileResult(mode="dry-run", **report.as_dict())  # no after_repair
    found, after = await run_in_threadpool(reconcile_and_verify, stores, unit_of_work, tenant)
    return ReconcileResult(
        mode="repair", **found.as_dict(), after_repair=ReconcileReportView(**after.as_dict())
    )


@router.get("/jobs")
def jobs_route(
    principal: Admin,
    state: JobState | None = None,
    stuck: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[JobRow]:
    """This tenant's recent ingest jobs, newest first; ``state`` for one state, ``stuck`` for
    queued or running jobs whose lease has expired."""
    with unit_of_work() as uow:
        rows = ops.list_jobs(
            uow.session,
            state=state.value if state else None,
            stuck=stuck,
            tenant_id=principal.tenant_id,
            limit=limit,
        )
        return rows


@router.get("/reconcile-runs")
def reconcile_runs_route(
    principal: Admin, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[ReconcileRunView]:
    """Recent reconcile runs of this tenant (dry runs and repairs), newest first."""
    with unit_of_work() as uow:
        return ops.list_reconcile_runs(uow.session, tenant_id=principal.tenant_id, limit=limit)


@router.get("/dead-letters")
def dead_letters_route(
    principal: Admin, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[DeadLetterView]:
    """This tenant's dead letters, newest first: jobs, Elasticsearch writes and upload events
    that failed for good, each with its stage, error and attempts."""
    with unit_of_work() as uow:
        letters = ops.list_dead_letters(uow.session, tenant_id=principal.tenant_id, limit=limit)
        return [jobs.dead_letter_view(d) for d in letters]


@router.get("/dead-letters/{letter_id}")
def dead_letter_route(letter_id: LetterId, principal: Admin) -> DeadLetterView:
    """One dead letter with what it kept of the failed work (never the raw content)."""
    with unit_of_work() as uow:
        return jobs.dead_letter_view(
            ops.get_dead_letter(uow.session, letter_id, principal.tenant_id)
        )


@router.post(
    "/dead-letters/{letter_id}/replay",
    responses=NOT_REPLAYABLE,
)
def replay_route(letter_id: LetterId, principal: Admin, stores: StoresDep) -> Replayed:
    """Run a dead letter again once its cause is fixed: a job gets a fresh set of attempts, an
    Elasticsearch write is queued again; the letter is removed."""
    with unit_of_work() as uow:
        replayed = ops.replay_dead_letter(uow, letter_id, principal.tenant_id, queue=stores.queue)
        return Replayed(replayed=replayed)


@router.delete("/dead-letters/{letter_id}")
def discard_route(letter_id: LetterId, principal: Admin) -> Discarded:
    """Remove a dead letter without running it again."""
    with unit_of_work() as uow:
        ops.discard_dead_letter(uow.session, letter_id, principal.tenant_id)
    return Discarded(discarded=True)


@router.get("/stats")
def stats_route(principal: Admin, stores: StoresDep) -> Stats:
    """This tenant's counts in both stores, plus the shared queue depths."""
    return ops.system_stats(stores, unit_of_work, principal.tenant_id)


@router.post("/keys", status_code=201, responses=API_KEY_LIMIT)
def create_key_route(body: KeyRequest, principal: Admin) -> CreatedKey:
    """A new key for this tenant; the secret is in this response only and never stored."""
    with unit_of_work() as uow:
        key, secret = create_key(
            uow.session, principal.tenant_id, body.name, sorted(set(body.scopes))
        )
        return CreatedKey(id=key.id, tenant_id=key.tenant_id, scopes=key.scopes, secret=secret)


@router.get("/keys")
def list_keys_route(principal: Admin) -> list[KeyView]:
    """This tenant's API keys (never their secrets), revoked ones included."""
    with unit_of_work() as uow:
        return list_keys(uow.session, principal.tenant_id)


@router.delete("/keys/{key_id}", status_code=204)
def revoke_key_route(key_id: uuid.UUID, principal: Admin) -> None:
    """Revoke a key. The API process that answers refuses it at once; every other API
    process within ``CONCORD_AUTH_CACHE_SECONDS`` (5 s by default), the time it may answer a
    key it verified from memory (a key revoked with `concord keys revoke` the same)."""
    with unit_of_work() as uow:
        if not revoke_key(uow.session, key_id, principal.tenant_id):
            raise NotFound(f"no key {key_id}")
    forget_key(key_id)  # committed: this process refuses it from now on


@router.post("/webhooks", status_code=201, responses=WEBHOOK_ENDPOINT_LIMIT)
def create_webhook_route(
    body: EndpointRequest, principal: Admin, settings: SettingsDep
) -> CreatedEndpoint:
    """A webhook endpoint for this tenant's job (and training) events; the signing secret is
    in this response only. Deliveries are signed (Concord-Signature: t=..,v2=HMAC-SHA256 of
    "t.delivery-id.body") and retried with backoff until the endpoint answers 2xx. A URL
    whose host is a loopback, private or link-local address (or localhost) is refused with
    422, and a name is checked again where it resolves at each delivery."""
    with unit_of_work() as uow:
        return webhooks.create_endpoint(
            uow.session, principal.tenant_id, body.url, body.events, settings
        )


@router.get("/webhooks")
def list_webhooks_route(principal: Admin) -> list[EndpointView]:
    """This tenant's webhook endpoints (never their signing secrets)."""
    with unit_of_work() as uow:
        return webhooks.list_endpoints(uow.session, principal.tenant_id)


@router.delete("/webhooks/{endpoint_id}", status_code=204)
def delete_webhook_route(endpoint_id: uuid.UUID, principal: Admin) -> None:
    """Remove the endpoint and its delivery log (pending deliveries are dropped with it)."""
    with unit_of_work() as uow:
        webhooks.delete_endpoint(uow.session, principal.tenant_id, endpoint_id)


@router.get("/webhooks/{endpoint_id}/deliveries")
def webhook_deliveries_route(
    endpoint_id: uuid.UUID,
    principal: Admin,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[DeliveryView]:
    """The endpoint's delivery log, newest first: each event's state, attempts, last HTTP
    status and error."""
    with unit_of_work() as uow:
        return webhooks.delivery_log(uow.session, principal.tenant_id, endpoint_id, limit)
