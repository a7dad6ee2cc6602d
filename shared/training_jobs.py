"""Reading reranker training jobs (the jobs API); ``training/jobs.py`` runs them."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from shared.models import TrainingJob

# A running job writes progress at least every few seconds; one silent for this long lost its
# worker (the task acks on start, so nothing redelivers it).
LOST_AFTER = timedelta(minutes=10)


def training_job_for_tenant(
    session: Session, tenant_id: str, job_id: uuid.UUID
) -> TrainingJob | None:
    job = session.get(TrainingJob, job_id)
    return job if job is not None and job.tenant_id == tenant_id else None


def job_dict(job: TrainingJob, current_time: datetime) -> dict[str, Any]:
    state = job.state
    if state == "running" and current_time - job.updated_at > LOST_AFTER:
        state = "lost"
    return {
        "id": str(job.id),
        "kind": "reranker_training",
        "name": job.name,
        "state": state,
        "progress": job.progress,
        "result": job.result,
        "error": job.error,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
    }
