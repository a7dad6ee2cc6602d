"""Egress control through the API and the real webhook worker: registration refuses every
literal non-public spelling, delivery refuses what slipped past it and a name that resolves
to this machine, and no connection reaches a listener it must not reach.

The suite's allow-list is 127.0.0.1/32 (tests/conftest.py: its receivers listen there); the
rest of 127.0.0.0/8 stays refused, so the listeners that must never be reached bind 127.0.0.2.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import wait_for
from tests.helpers import key_headers, suite_queue
from tests.unit.webhooks.test_egress import MEANS_127_0_0_1, REFUSED_HOSTS


def ipaddress(text: str) -> Any:
    import ipaddress as ip

    return ip.ip_address(text)


def test_registration_refuses_a_literal_private_address_in_any_spelling(
    client: TestClient, tenant: str
) -> None:
    """Through the API (whose allow-list is the suite's 127.0.0.1/32): each form that does
    not mean 127.0.0.1 is a 422 that says why; nothing is stored."""
    admin = key_headers(tenant, ["admin"])
    for host in [*sorted(set(REFUSED_HOSTS) - MEANS_127_0_0_1), "127.0.0.2", "2130706434"]:
        body = {"url": f"http://{host}:9200/x/_doc?refresh=true", "events": ["job.indexed"]}
        refused = client.post("/v1/admin/webhooks", json=body, headers=admin)
        assert refused.status_code == 422, (host, refused.text)
        assert "may not be sent to" in refused.json()["error"]["message"], host
    assert client.get("/v1/admin/webhooks", headers=admin).json() == []


class CountingListener:
    """A TCP listener that counts the connections made to it (and answers none)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def forbidden_listener() -> Iterator[CountingListener]:
    listener = CountingListener("127.0.0.2")  # loopback, outside the suite's allow-list
    yield listener
    listener.close()


def _endpoint_stored_as_is(tenant: str, url: str) -> uuid.UUID:
    """An endpoint row written past registration's check: as one registered before this
    release, or a name whose DNS answer changed since (rebinding)."""
    from shared.db import unit_of_work
    from shared.db.repository import now
    from shared.models import WebhookEndpoint
    from shared.tenants import repository as tenants_repo
    from shared.webhooks import repository as repo
    from shared.webhooks import service as webhooks

    endpoint_id = uuid.uuid4()
    with unit_of_work() as uow:
        tenants_repo.ensure_tenant(uow.session, tenant)
        repo.add_endpoint(
            uow.session,
            WebhookEndpoint(
                id=endpoint_id,
                tenant_id=tenant,
                url=url,
                events=["job.indexed"],
                secret="whsec_test",
                created_at=now(uow.session),
            ),
        )
        events = [(tenant, "job.indexed", {"event": "job.indexed", "n": 1})]
        webhooks.emit(uow, events, queue=suite_queue())
    return endpoint_id


def _log(tenant: str, endpoint_id: uuid.UUID) -> list[Any]:
    from shared.db import unit_of_work
    from shared.webhooks import service as webhooks

    with unit_of_work() as uow:
        return webhooks.delivery_log(uow.session, tenant, endpoint_id, 10)


def test_the_worker_refuses_at_delivery_an_address_that_slipped_past_registration(
    tenant: str, forbidden_listener: CountingListener, webhook_worker: Any
) -> None:
    """The real webhook worker, shipped sender: a stored URL aimed at 127.0.0.2 is refused
    when its delivery is sent, recorded as Concord's own classification, and no connection
    reaches the listener."""
    endpoint = _endpoint_stored_as_is(tenant, f"http://127.0.0.2:{forbidden_listener.port}/x")
    delivery = wait_for(lambda: next((d for d in _log(tenant, endpoint) if d.attempts), None),
                        60, what="the delivery's first attempt")  # fmt: skip
    assert delivery.state == "pending" and delivery.last_status is None
    assert delivery.last_error == "refused_destination: the address is loopback"
    assert forbidden_listener.connections == 0


def test_a_name_that_resolves_to_loopback_is_refused_at_delivery_without_a_connection(
    tenant: str, monkeypatch: pytest.MonkeyPatch, webhook_worker: Any
) -> None:
    """A name passes registration (only its resolution can judge it); at delivery it
    resolves to this machine and is refused before any connection, even to an address the
    sender would otherwise reach (this run has no allow-list). The name is resolved once:
    the address checked is the address dialled, so a second DNS answer cannot differ."""
    import anyio

    from shared.db import unit_of_work
    from shared.settings import get_settings
    from shared.webhooks.delivery import deliver_due
    from shared.webhooks.service import check_url
    from tests.helpers import paused

    listener = CountingListener("127.0.0.1")
    name = f"rebind-{uuid.uuid4().hex[:8]}.concord.test"
    check_url(f"http://{name}:{listener.port}/hook")  # a name: accepted at registration
    answers: list[str] = []

    async def resolve(host: str, port: int, **kwargs: Any) -> list[Any]:
        answers.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(anyio, "getaddrinfo", resolve)
    no_allow_list = get_settings().model_copy(update={"webhook_allowed_networks": ""})
    try:
        with paused(webhook_worker):  # this process's sender, with no allow-list, runs it
            endpoint = _endpoint_stored_as_is(tenant, f"http://{name}:{listener.port}/hook")
            deliver_due(unit_of_work, no_allow_list)
            (delivery,) = _log(tenant, endpoint)
    finally:
        listener.close()
    assert answers == [name]  # resolved once
    assert delivery.attempts == 1 and delivery.last_status is None
    # Before, the log said "NAME resolves only to refused addresses (127.0.0.1 ...)", so
    # a tenant admin learnt which internal names exist and what they resolve to. It says
    # neither now, and the same as for a name that does not resolve at all.
    assert delivery.last_error == (
        "refused_destination: the name resolves to no address a webhook may reach"
    )
    assert name not in delivery.last_error and "127.0.0.1" not in delivery.last_error
    assert listener.connections == 0

    async def nothing(host: str, port: int, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(anyio, "getaddrinfo", nothing)
    with paused(webhook_worker):
        missing = _endpoint_stored_as_is(tenant, f"http://nowhere-{name}/hook")
        deliver_due(unit_of_work, no_allow_list)
        (unresolved,) = _log(tenant, missing)
    assert unresolved.last_error == delivery.last_error
