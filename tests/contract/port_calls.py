"""Which port methods a contract's tests call. Each test class of a contract says what it
holds in ``PORTS``: a port and the methods of it the class's tests exercise (``ALL``: every
one). While the class runs, every adapter's methods of those ports record the calls made from
test code (the tests and their harnesses; an adapter calling its own methods does not count),
and once the whole class has run, each method it claims must have been called on an adapter
of that port (one with all the port's methods: the index's ``bucket_stats`` does not answer
for the vector store's).
test_ports.py then checks that the claims together cover every method of every port: a method
no contract exercises is a method no test holds to its promise."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

from shared import queue
from shared.stores import ports
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.embedding_cache import PgCachedEmbeddings
from shared.stores.memory import (
    MemoryCachedEmbeddings,
    MemoryChunkIndex,
    MemoryQueue,
    MemorySnapshots,
    MemoryVectorStore,
)
from shared.stores.snapshots import RedisSnapshots
from shared.stores.vector_store import PgVectorStore

ADAPTERS = (
    ElasticsearchChunkIndex,
    PgVectorStore,
    RedisSnapshots,
    queue.CeleryQueue,
    PgCachedEmbeddings,
    MemoryChunkIndex,
    MemoryVectorStore,
    MemorySnapshots,
    MemoryQueue,
    MemoryCachedEmbeddings,
)


ALL = None  # in PORTS: every method of the port
Claims = dict[type[Any], set[str] | None]


def methods(port: type[Any]) -> set[str]:
    """The public methods a port declares, its base ports' too."""
    return {
        name
        for cls in port.__mro__
        if cls not in (Protocol, object) and cls.__module__ == port.__module__
        for name, member in vars(cls).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def declared_ports() -> set[type[Any]]:
    """The stores' ports, and the task queue's."""
    return {
        member
        for member in vars(ports).values()
        if inspect.isclass(member) and member.__module__ == ports.__name__
    } | {queue.TaskQueue}


def claimed(claims: Claims) -> dict[type[Any], set[str]]:
    """A class's PORTS with ``ALL`` spelled out."""
    return {port: methods(port) if names is ALL else names for port, names in claims.items()}


Called = set[tuple[type[Any], str]]  # (adapter, method)


def implementers(port: type[Any]) -> list[type[Any]]:
    """The adapters with every method of ``port``."""
    return [a for a in ADAPTERS if all(callable(getattr(a, m, None)) for m in methods(port))]


def _recording(
    original: Callable[..., Any], adapter: type[Any], name: str, called: Called
) -> Callable[..., Any]:
    @functools.wraps(original)
    def record(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("tests."):
            called.add((adapter, name))
        return original(*args, **kwargs)

    return record


def _whole_class_ran(request: pytest.FixtureRequest) -> bool:
    """Every test of the class was selected (a run of a few of them, ``-k`` or a node id,
    cannot be expected to call every method)."""
    cls = request.node
    selected = [item for item in request.session.items if item.getparent(pytest.Class) is cls]
    return len(selected) == len(list(request.node.collect()))


@pytest.fixture(scope="class", autouse=True)
def port_calls(request: pytest.FixtureRequest) -> Iterator[Called]:
    held = claimed(getattr(request.cls, "PORTS", {}))
    called: Called = set()
    if not held:
        yield called
        return
    wanted = set().union(*held.values())
    with pytest.MonkeyPatch.context() as patch:
        for adapter in ADAPTERS:
            for name in wanted:
                original = getattr(adapter, name, None)
                if callable(original):
                    patch.setattr(adapter, name, _recording(original, adapter, name, called))
        yield called
    if _whole_class_ran(request):
        uncalled = sorted(
            f"{port.__name__}.{name}"
            for port, names in held.items()
            for name in names
            if not any((adapter, name) in called for adapter in implementers(port))
        )
        assert not uncalled, f"{request.cls.__name__} never calls {uncalled}"
