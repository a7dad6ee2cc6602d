"""Request and response bodies of search profiles."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.schemas import Timestamp
from shared.search.schemas import NO_NUL, ProfileSettings


class ProfileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    settings: ProfileSettings = Field(description="the search request fields the profile sets")
    description: str = Field(
        default="", max_length=2000, pattern=NO_NUL, description="what the profile is for"
    )


class ProfileView(BaseModel):
    name: str
    settings: dict[str, Any] = Field(description="the search request fields the profile sets")
    description: str
    updated_at: Timestamp
