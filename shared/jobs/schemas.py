"""Response models of jobs and dead letters."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.schemas import Timestamp


class JobError(BaseModel):
    """Where and why a job failed; ``message`` never carries SQL or another row's values."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    stage: str | None
    class_: str | None = Field(alias="class")
    message: str | None


class IngestJobView(BaseModel):
    """An ingest job as its tenant sees it: state, attempts, the error and its stage, the
    time each stage took."""

    id: uuid.UUID
    kind: Literal["ingest"] = "ingest"
    document_id: uuid.UUID
    version: int
    state: str
    attempts: int
    error: JobError | None
    stage_timings: dict[str, float]
    detail: dict[str, Any]
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None


class TrainingJobView(BaseModel):
    """A background reranker training (``concord reranker train --background``); ``lost``
    when it has written no progress for ten minutes."""

    id: uuid.UUID
    kind: Literal["reranker_training"] = "reranker_training"
    name: str
    state: str
    progress: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    created_at: Timestamp
    updated_at: Timestamp


class JobRow(BaseModel):
    """A job in the operator's list."""

    id: uuid.UUID
    tenant_id: str
    document_id: uuid.UUID
    external_id: str | None = Field(description="the document's external id (None: purged)")
    title: str | None = Field(description="the document's title (None: purged)")
    version: int
    state: str
    attempts: int
    error: str | None
    error_stage: str | None
    stage_timings: dict[str, float]
    created_at: Timestamp
    finished_at: Timestamp | None
    lease_expires_at: Timestamp | None


class DeadLetterView(BaseModel):
    id: int
    tenant_id: str
    source: str
    ref: str
    stage: str
    error_class: str
    message: str
    attempts: int
    payload: dict[str, Any]
    created_at: Timestamp
    replayable: bool = Field(
        description="whether replay can run it again: a job or an Elasticsearch write; an "
        "upload refused at intake is fixed by a corrected upload instead"
    )
    remedy: str = Field(description="what an operator can do about it, in a sentence")
