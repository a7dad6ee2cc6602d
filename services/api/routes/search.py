from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from services.api.deps import Reader
from shared.search.schemas import SearchRequest
from shared.search.service import search

router = APIRouter(prefix="/v1", tags=["search"])


@router.post("/search")
async def search_route(body: SearchRequest, principal: Reader) -> dict[str, Any]:
    """Hybrid search with fusion, optional rerank, MMR, and the evidence policy's decision.
    The tenant always comes from the API key, never from the request body."""
    return await run_in_threadpool(search, principal.tenant_id, body)
