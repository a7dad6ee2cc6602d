"""The search's one read transaction: a connection lost under it is a 503, wherever the
transaction finds out (in a stage, or only at its commit)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.exc import PendingRollbackError

from shared.errors import StoreUnavailable
from shared.search.service import _reads
from shared.settings import Settings


class _Session:
    def execute(self, *_: Any) -> None:  # the statement timeout: nothing to do here
        return None


def _transactions(fail_at_commit: bool) -> Any:
    @contextmanager
    def transactions() -> Iterator[Any]:
        yield SimpleNamespace(session=_Session())
        if fail_at_commit:  # what unit_of_work's commit raises on an invalidated connection
            raise PendingRollbackError("Can't reconnect until invalid transaction is rolled back")

    return transactions


def test_a_connection_lost_under_a_search_is_a_503_even_when_only_its_commit_finds_out() -> None:
    query = SimpleNamespace(settings=Settings())
    with pytest.raises(StoreUnavailable), _reads(_transactions(True), None, query):  # type: ignore[arg-type]
        pass  # no hit to hydrate: nothing in the search itself met the lost connection
    with pytest.raises(StoreUnavailable), _reads(_transactions(False), None, query):  # type: ignore[arg-type]
        raise PendingRollbackError("lost under a stage")
    with _reads(_transactions(False), None, query) as session:  # type: ignore[arg-type]
        assert isinstance(session, _Session)
