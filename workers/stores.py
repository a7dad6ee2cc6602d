"""The worker process's stores: its composition root builds them once per process, on the
first task that needs them (shared/stores/compose.py), and every task hands them to the
service it calls."""

from __future__ import annotations

from functools import lru_cache

from shared.settings import get_settings
from shared.stores.compose import Stores, connect


@lru_cache(maxsize=1)
def worker_stores() -> Stores:
    return connect(get_settings())
