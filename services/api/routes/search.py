from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from services.api.deps import Admin, Reader
from shared.db import unit_of_work
from shared.search import profiles
from shared.search.schemas import PROFILE_NAME, SearchRequest
from shared.search.service import search

router = APIRouter(prefix="/v1", tags=["search"])
ProfileName = Annotated[str, Path(pattern=PROFILE_NAME)]


@router.post("/search")
async def search_route(body: SearchRequest, principal: Reader) -> dict[str, Any]:
    """Hybrid search with fusion, optional rerank, MMR, and the evidence policy's decision.
    The tenant always comes from the API key, never from the request body."""
    return await run_in_threadpool(search, principal.tenant_id, body)


class ProfileBody(BaseModel):
    settings: dict[str, Any] = Field(
        description="Any search request fields except query, profile and explain"
    )
    description: str = Field(default="", max_length=2000)


@router.get("/profiles")
def list_profiles_route(principal: Reader) -> list[dict[str, Any]]:
    with unit_of_work() as uow:
        return [
            profiles.profile_dict(p)
            for p in profiles.list_profiles(uow.session, principal.tenant_id)
        ]


@router.get("/profiles/{name}")
def get_profile_route(name: ProfileName, principal: Reader) -> dict[str, Any]:
    with unit_of_work() as uow:
        return profiles.profile_dict(profiles.get_profile(uow.session, principal.tenant_id, name))


@router.put("/profiles/{name}")
def put_profile_route(name: ProfileName, body: ProfileBody, principal: Admin) -> dict[str, Any]:
    with unit_of_work() as uow:
        profile = profiles.save_profile(
            uow.session, principal.tenant_id, name, body.settings, body.description
        )
        return profiles.profile_dict(profile)


@router.delete("/profiles/{name}", status_code=204)
def delete_profile_route(name: ProfileName, principal: Admin) -> None:
    with unit_of_work() as uow:
        profiles.delete_profile(uow.session, principal.tenant_id, name)
