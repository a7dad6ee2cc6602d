"""Search profiles: named, per-tenant search settings (``concord tune`` writes them),
and their request and response bodies.

A profile holds any fields of a search request except the query itself; a request that names
a profile starts from the profile's fields, and the fields the request sets replace them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from shared.db.repository import now
from shared.errors import BadRequest
from shared.fields import NO_NUL
from shared.models import SearchProfile
from shared.schemas import Timestamp
from shared.search.schemas import NOT_IN_PROFILE, ProfileSettings, SearchRequest
from shared.tenants.named import NamedRegistry


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


def validate_profile_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A profile's settings must form a valid request once a query is added."""
    misplaced = NOT_IN_PROFILE & set(settings)
    if misplaced:
        raise BadRequest(f"a profile cannot set {', '.join(sorted(misplaced))}")
    try:
        request = SearchRequest.model_validate({"query": "profile check", **settings})
    except ValueError as e:
        raise BadRequest(f"invalid profile settings: {e}") from e
    return request.model_dump(mode="json", by_alias=True, include=set(settings))


PROFILES = NamedRegistry(SearchProfile, "search profile")


def save_profile(
    session: Session, tenant_id: str, name: str, settings: dict[str, Any], description: str = ""
) -> SearchProfile:
    clean = validate_profile_settings(settings)
    profile = PROFILES.for_writing(session, tenant_id, name)
    profile.settings = clean
    profile.description = description
    profile.updated_at = now(session)
    session.flush()
    return profile


get_profile, list_profiles, delete_profile = PROFILES.get, PROFILES.list, PROFILES.delete


def profile_view(profile: SearchProfile) -> ProfileView:
    return ProfileView(
        name=profile.name,
        settings=profile.settings,
        description=profile.description,
        updated_at=profile.updated_at,
    )


def resolve_profile(session: Session, tenant_id: str, request: SearchRequest) -> SearchRequest:
    """The request with its profile's settings filled in (the request's own fields win)."""
    if request.profile is None:
        return request
    profile = get_profile(session, tenant_id, request.profile)
    own = request.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return SearchRequest.model_validate({**profile.settings, **own})
