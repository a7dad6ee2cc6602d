"""Request and response bodies of API keys."""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from shared.fields import NO_NUL
from shared.schemas import Timestamp

SCOPES = ("read", "write", "admin")
Scope = Annotated[str, Field(pattern="^(" + "|".join(SCOPES) + ")$")]


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[Scope] = Field(
        default=["read"],
        min_length=1,
        max_length=len(SCOPES),
        description="read: search and read; write: upload and delete; admin: this tenant's "
        "operations, keys and webhooks (implies read and write)",
    )
    name: str = Field(
        default="api", min_length=1, max_length=200, pattern=NO_NUL, description="a label"
    )


class CreatedKey(BaseModel):
    """The new key; ``secret`` is in this response only and never stored."""

    id: uuid.UUID
    tenant_id: str
    scopes: list[str]
    secret: str


class KeyView(BaseModel):
    id: uuid.UUID
    tenant_id: str
    name: str
    prefix: str
    scopes: list[str]
    created_at: Timestamp
    revoked: bool
