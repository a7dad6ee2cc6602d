from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from services.api.deps import Reader
from shared.search.service import Mode, as_dict, search

router = APIRouter(prefix="/v1", tags=["search"])


class SearchRequest(BaseModel):
    query: str = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=10, ge=1, le=100)
    mode: Mode = "hybrid"


@router.post("/search")
async def search_route(body: SearchRequest, principal: Reader) -> dict[str, Any]:
    # The tenant always comes from the API key, never from the request body.
    response = await run_in_threadpool(
        search, principal.tenant_id, body.query, body.top_k, body.mode
    )
    return as_dict(response)
