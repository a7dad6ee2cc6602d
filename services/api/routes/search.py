from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from starlette.background import BackgroundTask

from services.api.deps import (
    MODEL_OUT_OF_DATE,
    NOT_FOUND,
    PROTECTED_ROUTE_ERRORS,
    Admin,
    Reader,
    SettingsDep,
    StoresDep,
)
from shared.answerability import service as answerability
from shared.answerability.schemas import AnswerabilityModelView
from shared.db import Transactions, read_unit_of_work, replica_configured, unit_of_work
from shared.rerankers import service as rerankers
from shared.rerankers.schemas import RerankerView
from shared.search import profiles
from shared.search.profiles import ProfileBody, ProfileView
from shared.search.schemas import PROFILE_NAME, SearchPage, SearchRequest, SearchResponse
from shared.search.service import queue_purges_after_response, search, search_next_page
from shared.settings import Settings
from shared.stores.compose import Stores
from shared.tenants.admission import search_admission

router = APIRouter(prefix="/v1", tags=["search"], responses=PROTECTED_ROUTE_ERRORS)
# A search names a profile, reranker or answerability model (or a page cursor) that may be
# missing, or a model trained before its reranker.
SEARCH_ERRORS = NOT_FOUND | MODEL_OUT_OF_DATE
ProfileName = Annotated[str, Path(pattern=PROFILE_NAME)]


def _replica() -> Transactions | None:
    """The read replica's transactions for the query path, when one is configured."""
    return read_unit_of_work if replica_configured() else None


@router.post("/search", response_model=SearchResponse, responses=SEARCH_ERRORS)
async def search_route(
    body: SearchRequest,
    principal: Reader,
    settings: SettingsDep,
    stores: StoresDep,
    cache_control: Annotated[
        str | None,
        Header(description="no-cache: encode the query even if the query cache holds it"),
    ] = None,
) -> Response:
    """Hybrid search with fusion, optional rerank, MMR, and the evidence policy's decision.
    The tenant always comes from the API key, never from the request body."""
    embedding_cache = "no-cache" not in (cache_control or "").lower()
    async with search_admission.slot(principal.tenant_id, settings):
        response = await run_in_threadpool(
            search,
            stores,
            unit_of_work,
            principal.tenant_id,
            body,
            replica=_replica(),
            embedding_cache=embedding_cache,
            purge_stale=False,
        )
    # The response is a model already: encoded once by pydantic, not validated and walked
    # again by FastAPI (a 100-result response with traces spent 3.7 ms in its encoder).
    # Unset fields (``trace`` and ``timings_ms`` without explain) are left out.
    return _encoded(response, stores, principal.tenant_id, settings)


@router.post("/search/next", response_model=SearchResponse, responses=SEARCH_ERRORS)
async def search_next_page_route(
    body: SearchPage, principal: Reader, settings: SettingsDep, stores: StoresDep
) -> Response:
    """The next page of a paginated search. Pages follow the ranking the first search made
    (``"paginate": true``); 404 once the cursor has expired, or for another tenant's cursor."""
    async with search_admission.slot(principal.tenant_id, settings):
        response = await run_in_threadpool(
            search_next_page,
            stores,
            unit_of_work,
            principal.tenant_id,
            body.cursor,
            replica=_replica(),
            purge_stale=False,
        )
    return _encoded(response, stores, principal.tenant_id, settings)


def _encoded(
    response: SearchResponse, stores: Stores, tenant_id: str, settings: Settings
) -> Response:
    """The response's JSON, with its stage timings in a Server-Timing header; the purges of
    the stale copies the search met are queued after it is sent."""
    return Response(
        response.model_dump_json(exclude_unset=True),
        media_type="application/json",
        headers={"Server-Timing": response.server_timing()},
        background=BackgroundTask(
            queue_purges_after_response, stores, unit_of_work, settings, tenant_id, response
        ),
    )


@router.get("/rerankers")
def list_rerankers_route(principal: Reader) -> list[RerankerView]:
    """Rerankers trained on this tenant's judgements (concord reranker train), with their
    model cards; select one with "rerank": {"enabled": true, "model": NAME}."""
    with unit_of_work() as uow:
        return [
            rerankers.reranker_view(r)
            for r in rerankers.list_for_tenant(uow.session, principal.tenant_id)
        ]


@router.get("/answerability-models")
def list_answerability_models_route(principal: Reader) -> list[AnswerabilityModelView]:
    """This tenant's answerability models (concord answerability train), with thresholds and
    model cards. Learned from its judgements; select one with "policy": {"score_type":
    "answerability", "answerability_model": NAME} (default "default")."""
    with unit_of_work() as uow:
        return [
            answerability.model_view(m)
            for m in answerability.list_for_tenant(uow.session, principal.tenant_id)
        ]


@router.get("/answerability-models/{name}")
def get_answerability_model_route(name: ProfileName, principal: Reader) -> AnswerabilityModelView:
    """One answerability model of this tenant: its features, weights and when it was trained."""
    with unit_of_work() as uow:
        return answerability.model_view(answerability.get(uow.session, principal.tenant_id, name))


@router.get("/profiles")
def list_profiles_route(principal: Reader) -> list[ProfileView]:
    """This tenant's search profiles: named sets of search options a request selects."""
    with unit_of_work() as uow:
        return [
            profiles.profile_view(p)
            for p in profiles.list_profiles(uow.session, principal.tenant_id)
        ]


@router.get("/profiles/{name}")
def get_profile_route(name: ProfileName, principal: Reader) -> ProfileView:
    """One search profile of this tenant."""
    with unit_of_work() as uow:
        return profiles.profile_view(profiles.get_profile(uow.session, principal.tenant_id, name))


@router.put("/profiles/{name}")
def put_profile_route(name: ProfileName, body: ProfileBody, principal: Admin) -> ProfileView:
    """Create or replace a search profile of this tenant (admin keys)."""
    with unit_of_work() as uow:
        profile = profiles.save_profile(
            uow.session,
            principal.tenant_id,
            name,
            body.settings.model_dump(mode="json", by_alias=True, exclude_unset=True),
            body.description,
        )
        return profiles.profile_view(profile)


@router.delete("/profiles/{name}", status_code=204)
def delete_profile_route(name: ProfileName, principal: Admin) -> None:
    """Delete a search profile of this tenant (admin keys)."""
    with unit_of_work() as uow:
        profiles.delete_profile(uow.session, principal.tenant_id, name)
