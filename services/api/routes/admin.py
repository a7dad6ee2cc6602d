"""Admin-only endpoints: the operator commands of the CLI over HTTP (scope ``admin``)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from services.api.deps import Admin
from shared import admin as ops
from shared.auth import create_key, list_keys, revoke_key
from shared.db import unit_of_work
from shared.errors import NotFound
from shared.reconcile.service import reconcile, reconcile_and_verify

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class ReconcileRequest(BaseModel):
    tenant: str | None = None
    repair: bool = False


@router.post("/reconcile")
async def reconcile_route(body: ReconcileRequest, _: Admin) -> dict[str, Any]:
    if not body.repair:
        report = await run_in_threadpool(reconcile, body.tenant, False)
        return {"mode": "dry-run", **report.as_dict()}
    found, after = await run_in_threadpool(reconcile_and_verify, body.tenant)
    return {"mode": "repair", **found.as_dict(), "after_repair": after.as_dict()}


@router.get("/jobs")
def jobs_route(
    _: Admin,
    state: str | None = None,
    stuck: bool = False,
    tenant: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    with unit_of_work() as uow:
        rows = ops.list_jobs(uow.session, state=state, stuck=stuck, tenant_id=tenant, limit=limit)
        return [ops.job_dict(j) for j in rows]


@router.get("/reconcile-runs")
def reconcile_runs_route(
    _: Admin, tenant: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[dict[str, Any]]:
    """Recent reconcile runs (dry runs and repairs, the beat's too), newest first."""
    with unit_of_work() as uow:
        return ops.list_reconcile_runs(uow.session, tenant_id=tenant, limit=limit)


@router.get("/dead-letters")
def dead_letters_route(
    _: Admin, tenant: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    with unit_of_work() as uow:
        return [
            ops.dead_letter_dict(d)
            for d in ops.list_dead_letters(uow.session, tenant_id=tenant, limit=limit)
        ]


@router.get("/dead-letters/{letter_id}")
def dead_letter_route(letter_id: int, _: Admin) -> dict[str, Any]:
    with unit_of_work() as uow:
        return ops.dead_letter_dict(ops.get_dead_letter(uow.session, letter_id))


@router.post("/dead-letters/{letter_id}/replay")
def replay_route(letter_id: int, _: Admin) -> dict[str, str]:
    with unit_of_work() as uow:
        return {"replayed": ops.replay_dead_letter(uow, letter_id)}


@router.delete("/dead-letters/{letter_id}")
def discard_route(letter_id: int, _: Admin) -> dict[str, bool]:
    with unit_of_work() as uow:
        ops.discard_dead_letter(uow.session, letter_id)
    return {"discarded": True}


@router.get("/stats")
def stats_route(_: Admin) -> dict[str, Any]:
    return ops.system_stats()


class KeyRequest(BaseModel):
    tenant: str
    scopes: list[str] = ["read"]
    name: str = "api"


@router.post("/keys", status_code=201)
def create_key_route(body: KeyRequest, _: Admin) -> dict[str, Any]:
    """A new key for a tenant; the secret is in this response only and never stored."""
    with unit_of_work() as uow:
        key, secret = create_key(uow.session, body.tenant, body.name, body.scopes)
        return {
            "id": str(key.id),
            "tenant_id": key.tenant_id,
            "scopes": key.scopes,
            "secret": secret,
        }


@router.get("/keys")
def list_keys_route(_: Admin) -> list[dict[str, Any]]:
    with unit_of_work() as uow:
        return list_keys(uow.session)


@router.delete("/keys/{key_id}", status_code=204)
def revoke_key_route(key_id: uuid.UUID, _: Admin) -> None:
    with unit_of_work() as uow:
        if not revoke_key(uow.session, key_id):
            raise NotFound(f"no key {key_id}")
