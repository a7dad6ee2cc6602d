"""When the query path may read the streaming replica instead of the primary.

A replica replays the primary's WAL some milliseconds (or, under load or after a network
fault, much longer) behind. A search reads it only once it has replayed every transaction
committed before the search began: the primary's WAL position is taken first, and the replica
must have replayed past it. Then what the replica returns is what the primary would have
returned at that moment, so a version the primary holds is never served older; hits
Elasticsearch knows at a newer version than that are what a primary read racing the same write
would see. A replica that is behind for longer than ``pg_read_max_wait_ms``, or unreachable,
is not read: the search reads the primary (``primary_fallback``).
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import SQLAlchemyError

from shared.db import Transactions
from shared.db import repository as repo
from shared.settings import Settings

log = logging.getLogger(__name__)

POLL_S = 0.005


def reads_for_search(
    primary: Transactions, replica: Transactions | None, settings: Settings
) -> tuple[Transactions, str]:
    """The transactions a search's reads use, and where they go: ``replica``, ``primary``
    (none configured, or the primary's position could not be read) or ``primary_fallback``."""
    if replica is None:
        return primary, "primary"
    try:
        with primary() as uow:
            position = repo.wal_lsn(uow.session)
    except SQLAlchemyError as e:  # the search's own reads of the primary will say more
        log.warning("primary WAL position unavailable: %s", e)
        return primary, "primary"
    deadline = time.monotonic() + settings.pg_read_max_wait_ms / 1000
    while True:
        try:
            with replica() as uow:
                if repo.replayed_past(uow.session, position):
                    return replica, "replica"
        except SQLAlchemyError as e:
            log.warning("read replica unavailable: %s: %s", type(e).__name__, e)
            return primary, "primary_fallback"
        if time.monotonic() >= deadline:
            return primary, "primary_fallback"
        time.sleep(POLL_S)
