"""Request dependencies as ``Annotated`` aliases; routers show only domain parameters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from shared.db import unit_of_work
from shared.errors import Unauthorized
from shared.settings import Settings, get_settings
from shared.stores.compose import Stores
from shared.tenants import admission, ratelimit
from shared.tenants.service import (
    Principal,
    authenticate_recent,
    check_key_format,
    recently_authenticated,
)

# Declared as security schemes, so the OpenAPI document says which routes need a key and
# clients (and schemathesis) know how to send one. auto_error=False: a missing or malformed
# header is answered by ``authenticate`` with Concord's own 401 body.
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key")


# The scope key under which an in-process call carries the principal its caller was already
# authenticated (and rate-limited) as: the MCP endpoint's tools call the API's own routes
# (services/mcp/endpoint.py). Only code in this process builds ASGI scopes, so no client can
# set it.
PRINCIPAL_SCOPE_KEY = "concord.principal"


async def current_principal(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """The key's principal, within its rate limit (see ``authenticate``)."""
    authenticated = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if isinstance(authenticated, Principal):
        return authenticated
    return await authenticate(request, (bearer.credentials if bearer else None) or api_key)


async def authenticate(request: Request, secret: str | None) -> Principal:
    """The principal of ``secret``, within its rate limit. A key verified within
    ``auth_cache_seconds`` is answered from memory on the event loop; only a lookup goes to
    a thread (a sync dependency would send every request through the thread pool once more
    before its route: about 1 ms of a 25 ms search on two cores). A client address that
    failed too often is refused before its key is looked at (shared/tenants/admission.py)."""
    settings = get_settings()
    ttl_s = settings.auth_cache_seconds
    principal = recently_authenticated(secret, ttl_s)
    if principal is None:
        network = admission.client_network(
            request.client.host if request.client else "unknown",
            request.headers.get("x-forwarded-for"),
            settings,
        )
        # Counted as a failure before the key is looked at (so concurrent wrong keys cannot
        # all pass an almost empty bucket), handed back when the key is valid.
        await admission.failed_auth.reserve(network, settings)
        try:
            if secret:
                check_key_format(secret)  # on the event loop: no thread, no lookup
            principal = await run_in_threadpool(authenticate_recent, unit_of_work, secret, ttl_s)
        except Unauthorized:
            raise
        except BaseException:
            await admission.failed_auth.refund(network, settings)  # not the key's failure
            raise
        await admission.failed_auth.refund(network, settings)
    await ratelimit.enforce(principal.key_id, principal.tenant_id)
    return principal


async def reader(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("read")
    return principal


async def writer(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("write")
    return principal


async def admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("admin")
    return principal


SettingsDep = Annotated[Settings, Depends(get_settings)]


def _stores(request: Request) -> Stores:
    """The stores the app was built with (services/api/app.py, its composition root)."""
    stores: Stores = request.app.state.stores
    return stores


StoresDep = Annotated[Stores, Depends(_stores)]
Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error the API returns: ``{"error": {"code": ..., "message": ...}}``."""

    error: ErrorDetail


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": ErrorBody,
        "description": description,
        **({"headers": headers} if headers else {}),
    }


# The errors any authenticated route can answer, declared once per router. What else a
# route can answer follows from its shape (services/api/openapi.py): a body's 400, 413 and
# 422, a parameter's 422, an object named in the path's 404; a route declares the rest.
PROTECTED_ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("No API key, or an unknown or revoked one"),
    403: _error("The key lacks the scope this route needs"),
    429: _error(
        "Too many requests: the key's rate limit, or the tenant's share of concurrent searches",
        {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
    ),
    503: _error("A store Concord needs is unavailable; retry later"),
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("The request body could not be parsed, or a value is not acceptable"),
    413: _error("The request body is larger than CONCORD_MAX_REQUEST_BYTES"),
    422: _error("The request is invalid; the message says which field and why"),
}
INVALID_PARAMETER: dict[int | str, dict[str, Any]] = {
    422: _error("A path or query parameter is invalid; the message says which and why")
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: _error("No such object for the caller's tenant")}
# A search's answerability model was trained on an earlier training of the reranker it reads.
MODEL_OUT_OF_DATE: dict[int | str, dict[str, Any]] = {
    409: _error("The selected answerability model is out of date with its reranker: train it again")
}
WEBHOOK_ENDPOINT_LIMIT: dict[int | str, dict[str, Any]] = {
    409: _error("The tenant has as many webhook endpoints as it may: delete one first")
}
NOT_REPLAYABLE: dict[int | str, dict[str, Any]] = {
    400: _error("An upload event's dead letter cannot be replayed: its producer sends it again")
}
API_KEY_LIMIT: dict[int | str, dict[str, Any]] = {
    409: _error("The tenant has as many unrevoked API keys as it may: revoke one first")
}
UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("The upload is malformed (e.g. a bad filename or metadata)"),
    413: _error("The upload is larger than CONCORD_MAX_UPLOAD_BYTES"),
    415: _error("The content is not a supported type (checked by its bytes, not its header)"),
}
