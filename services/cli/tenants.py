"""One tenant rule for every command that acts on one tenant's data: ``--tenant T``, or else
the tenant of the key in ``CONCORD_API_KEY`` (as ``search`` has always done), the key checked
as the API checks it."""

from __future__ import annotations

import os
from typing import Any

import typer

from services.cli.errors import usage

HELP = "The tenant (default: the tenant of the key in CONCORD_API_KEY)."


def option(help_text: str = HELP) -> Any:
    """The ``--tenant`` option of a one-tenant command."""
    return typer.Option(None, "--tenant", help=help_text)


def resolve(tenant: str | None) -> str:
    """``tenant``, or the tenant of the key in CONCORD_API_KEY."""
    if tenant:
        return tenant
    secret = os.environ.get("CONCORD_API_KEY", "")
    if not secret:
        raise usage("pass --tenant T, or set CONCORD_API_KEY to one of the tenant's keys")
    from shared.db import unit_of_work
    from shared.tenants.service import authenticate

    with unit_of_work() as uow:
        return authenticate(uow.session, secret).tenant_id
