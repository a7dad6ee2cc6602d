"""Egress control: a tenant's webhook URL never makes Concord connect to this machine's own
services or a private network, whatever spelling the address takes, at registration or at
delivery (where a name is resolved once and the checked address is the one connected to).

The suite's allow-list is 127.0.0.1/32 (tests/conftest.py: its receivers listen there); the
rest of 127.0.0.0/8 stays refused, so the listeners that must never be reached bind 127.0.0.2.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from shared.egress import EgressRefused, check_destination_url, literal_address, refusal
from shared.settings import Settings
from tests.conftest import wait_for
from tests.helpers import key_headers

# Every spelling of a refused address seen from an attacker, and where each lands.
REFUSED_HOSTS = {
    "127.0.0.1": "127.0.0.1",
    "localhost": None,
    "LOCALHOST.": None,
    "api.localhost": None,
    "[::1]": "::1",
    "0.0.0.0": "0.0.0.0",
    "2130706433": "127.0.0.1",
    "127.1": "127.0.0.1",
    "0x7f000001": "127.0.0.1",
    "0x7f.1": "127.0.0.1",
    "169.254.169.254": "169.254.169.254",
    "10.1.2.3": "10.1.2.3",
    "172.16.0.1": "172.16.0.1",
    "192.168.1.1": "192.168.1.1",
    "100.64.0.1": "100.64.0.1",
    "224.0.0.1": "224.0.0.1",
    "240.0.0.1": "240.0.0.1",
    "[::ffff:127.0.0.1]": "::ffff:7f00:1",
    "[::ffff:10.0.0.1]": "::ffff:a00:1",
    "[::127.0.0.1]": "::7f00:1",
    "[2002:7f00:1::]": "2002:7f00:1::",
    "[64:ff9b::a9fe:a9fe]": "64:ff9b::a9fe:a9fe",
    "[fe80::1]": "fe80::1",
    "[fc00::1]": "fc00::1",
    "[ff02::1]": "ff02::1",
}
# Forms that mean 127.0.0.1 exactly: the allow-list 127.0.0.1/32 lets these through.
MEANS_127_0_0_1 = {"127.0.0.1", "localhost", "LOCALHOST.", "api.localhost", "2130706433",
                   "127.1", "0x7f000001", "0x7f.1", "[::ffff:127.0.0.1]", "[::127.0.0.1]",
                   "[2002:7f00:1::]"}  # fmt: skip


@pytest.mark.parametrize("host", sorted(REFUSED_HOSTS))
def test_every_spelling_of_a_non_public_address_is_refused_with_and_without_the_allow_list(
    host: str,
) -> None:
    url = httpx.URL(f"http://{host}:9200/some-index/_doc")
    literal = literal_address(host)
    assert (None if literal is None else str(literal)) == REFUSED_HOSTS[host]
    with pytest.raises(EgressRefused):
        check_destination_url(url, ())
    allowed = Settings(webhook_allowed_networks="127.0.0.1/32").webhook_allowed()
    if host in MEANS_127_0_0_1:
        check_destination_url(url, allowed)  # the operator allowed exactly this
    else:
        with pytest.raises(EgressRefused):
            check_destination_url(url, allowed)


def test_public_addresses_and_names_pass_and_the_allow_list_opens_only_its_networks() -> None:
    for host in ("93.184.215.14", "[2606:4700::1111]", "hooks.example.com"):
        check_destination_url(httpx.URL(f"https://{host}/hook"), ())
    private = Settings(webhook_allowed_networks="10.20.0.0/16, 192.168.7.0/24").webhook_allowed()
    assert refusal(ipaddress("10.20.3.4"), private) is None
    assert refusal(ipaddress("10.21.3.4"), private) is not None
    assert refusal(ipaddress("::ffff:192.168.7.9"), private) is None  # the same host, mapped
    with pytest.raises(ValueError, match="CIDRs"):
        Settings(webhook_allowed_networks="10.0.0.0/33")


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
        webhooks.emit(uow, [(tenant, "job.indexed", {"event": "job.indexed", "n": 1})])
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
    assert delivery.last_error.startswith("refused_destination: 127.0.0.2 is a loopback")
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
    assert delivery.last_error == (
        f"refused_destination: {name} resolves only to refused addresses "
        "(127.0.0.1 is a loopback address)"
    )
    assert listener.connections == 0
