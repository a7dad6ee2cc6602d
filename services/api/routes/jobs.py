from __future__ import annotations

import uuid

from fastapi import APIRouter

from services.api.deps import PROTECTED_ROUTE_ERRORS, Reader
from shared.db import unit_of_work
from shared.db.repository import now
from shared.errors import NotFound
from shared.jobs import repository as repo
from shared.jobs import service as jobs
from shared.jobs.schemas import IngestJobView, TrainingJobView

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=PROTECTED_ROUTE_ERRORS)


@router.get("/{job_id}")
def get_job(job_id: uuid.UUID, principal: Reader) -> IngestJobView | TrainingJobView:
    """An ingest job (state, attempts, error, stage timings) or a background reranker
    training of the caller's tenant."""
    with unit_of_work() as uow:
        job = repo.job_for_tenant(uow.session, principal.tenant_id, job_id)
        if job is not None:
            return jobs.ingest_job_view(job)
        training = repo.training_job_for_tenant(uow.session, principal.tenant_id, job_id)
        if training is None:
            raise NotFound(f"job {job_id} not found")
        return jobs.training_job_view(training, now(uow.session))
