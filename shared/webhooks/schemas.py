"""Request and response bodies of the webhook admin API."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.schemas import Timestamp

WebhookEvent = Literal[
    "job.indexed", "job.failed", "job.dead_lettered", "training.finished", "training.failed"
]


class EndpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=r"^https?://[^\s/?#]+[^\s]*$",
        description="where deliveries are POSTed: a public address (private, loopback and "
        "link-local ones are refused unless CONCORD_WEBHOOK_ALLOWED_NETWORKS allows them)",
    )
    events: list[WebhookEvent] = Field(
        min_length=1, max_length=5, description="the job and training events to deliver"
    )


class EndpointView(BaseModel):
    id: uuid.UUID
    url: str
    events: list[str]
    created_at: Timestamp


class CreatedEndpoint(EndpointView):
    secret: str = Field(
        description="signs every delivery (Concord-Signature); shown only now, keep it"
    )


class DeliveryView(BaseModel):
    id: int
    event: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: Timestamp
    next_attempt_at: Timestamp | None = Field(description="while pending")
    delivered_at: Timestamp | None
    payload: dict[str, object]
