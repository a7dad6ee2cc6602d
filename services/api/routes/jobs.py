from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from services.api.deps import NOT_FOUND, PROTECTED_ROUTE_ERRORS, Reader
from shared import training_jobs
from shared.db import now, unit_of_work
from shared.errors import NotFound
from shared.ingest import repository as repo

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=PROTECTED_ROUTE_ERRORS | NOT_FOUND)


@router.get("/{job_id}")
def get_job(job_id: uuid.UUID, principal: Reader) -> dict[str, Any]:
    with unit_of_work() as uow:
        job = repo.job_for_tenant(uow.session, principal.tenant_id, job_id)
        if job is None:
            training = training_jobs.training_job_for_tenant(
                uow.session, principal.tenant_id, job_id
            )
            if training is None:
                raise NotFound(f"job {job_id} not found")
            return training_jobs.job_dict(training, now(uow.session))
        return {
            "id": str(job.id),
            "kind": "ingest",
            "document_id": str(job.document_id),
            "version": job.version,
            "state": job.state,
            "attempts": job.attempts,
            "error": None
            if job.error_class is None
            else {"stage": job.error_stage, "class": job.error_class, "message": job.error_message},
            "stage_timings": job.stage_timings,
            "detail": job.detail,
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        }
