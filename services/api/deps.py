"""Request dependencies as ``Annotated`` aliases; routers show only domain parameters."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from shared import ratelimit
from shared.auth import Principal, authenticate
from shared.db import unit_of_work
from shared.settings import Settings, get_settings


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def current_principal(
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    with unit_of_work() as uow:
        principal = authenticate(uow.session, _bearer(authorization) or x_api_key)
    ratelimit.enforce(principal.key_id)
    return principal


def reader(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("read")
    return principal


def writer(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("write")
    return principal


def admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    principal.require("admin")
    return principal


SettingsDep = Annotated[Settings, Depends(get_settings)]
Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]
