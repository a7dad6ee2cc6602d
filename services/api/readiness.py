"""Readiness: every store the API needs answers, and the schema is at the latest migration."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from alembic.script import ScriptDirectory

from shared.db import unit_of_work
from shared.db.repository import schema_revision
from shared.migrate import ROOT
from shared.redis_client import redis_client
from shared.settings import Settings
from shared.stores.ports import IndexHealth

MIGRATIONS = ROOT / "migrations"


@lru_cache(maxsize=1)
def _latest_migration() -> str | None:
    """The migration scripts ship with the code: read once per process, not per probe."""
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def _postgres(settings: Settings) -> dict[str, Any]:
    head = _latest_migration()
    with unit_of_work() as uow:
        current = schema_revision(uow.session)
    if current != head:
        return {"ok": False, "detail": f"schema at {current}, latest migration is {head}"}
    return {"ok": True, "detail": f"schema at {current}"}


def _elasticsearch(index: IndexHealth) -> dict[str, Any]:
    status = index.cluster_status(timeout_s=2)
    return {"ok": status in ("green", "yellow"), "detail": f"cluster {status}"}


def _redis(settings: Settings) -> dict[str, Any]:
    redis_client(2.0).ping()
    return {"ok": True, "detail": "ping"}


def readiness_checks(settings: Settings, index: IndexHealth) -> dict[str, dict[str, Any]]:
    checks = {}
    probes: dict[str, Callable[[], dict[str, Any]]] = {
        "postgres": lambda: _postgres(settings),
        "elasticsearch": lambda: _elasticsearch(index),
        "redis": lambda: _redis(settings),
    }
    for name, check in probes.items():
        try:
            checks[name] = check()
        except Exception as e:  # unready, with the reason; never a 500
            checks[name] = {"ok": False, "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    return checks
