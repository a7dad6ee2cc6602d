"""Webhooks end to end, with the shipped retry settings: a real local receiver that is down
when the jobs finish gets every event once it is back up, each signed (HMAC-SHA256 over the
timestamp and body) and logged per endpoint with its attempts; a tenant sees only its own."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fastapi.testclient import TestClient

from shared.webhooks.signing import verify
from tests.conftest import wait_for
from tests.helpers import key_headers, upload_text, wait_job


class Receiver:
    """An HTTP server on a fixed port that records every request; down until started."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/concord"

    def start(self) -> None:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def register(client: TestClient, tenant: str, url: str, events: list[str] | None = None) -> str:
    """A webhook endpoint of ``tenant`` (its admin key) at ``url``; its id."""
    body = {"url": url, "events": events or ["job.indexed"]}
    created = client.post("/v1/admin/webhooks", json=body, headers=key_headers(tenant, ["admin"]))
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_a_receiver_down_for_a_while_gets_every_event_signed_once_it_is_back(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    admin = key_headers(tenant, ["admin"])
    receiver = Receiver()
    created = client.post(
        "/v1/admin/webhooks",
        json={"url": receiver.url, "events": ["job.indexed", "job.failed"]},
        headers=admin,
    )
    assert created.status_code == 201, created.text
    endpoint, secret = created.json()["id"], created.json()["secret"]
    assert "secret" not in client.get("/v1/admin/webhooks", headers=admin).json()[0]

    good = upload_text(client, auth, "tide", "Tides follow the moon.")
    bad = client.post(
        "/v1/documents",
        headers=auth,
        files={
            "file": ("empty.html", b"<html><body><script>x</script></body></html>", "text/html")
        },
    ).json()
    wait_job(client, auth, good["job_id"])
    wait_job(client, auth, bad["job_id"], state="failed")

    def log() -> list[dict[str, Any]]:
        response = client.get(f"/v1/admin/webhooks/{endpoint}/deliveries", headers=admin)
        assert response.status_code == 200, response.text
        return list(response.json())

    # Down: the attempts fail, are logged with their error, and stay pending for a retry.
    wait_for(lambda: (len(log()) == 2 and all(d["attempts"] >= 2 for d in log())) or None, 60,
             what="two failed attempts each while the receiver is down")  # fmt: skip
    for delivery in log():
        assert delivery["state"] == "pending" and delivery["next_attempt_at"]
        assert "Connect" in delivery["last_error"]
    assert receiver.received == []

    receiver.start()
    try:
        wait_for(lambda: all(d["state"] == "delivered" for d in log()) or None, 90,
                 what="both deliveries once the receiver is up")  # fmt: skip
    finally:
        receiver.stop()
    events = {}
    for headers, body in receiver.received:
        assert verify(secret, headers["Concord-Signature"], body)
        assert not verify("whsec_wrong", headers["Concord-Signature"], body)
        assert not verify(secret, headers["Concord-Signature"], body, now=time.time() + 3600)
        payload = json.loads(body)
        events[payload["event"]] = payload
        assert headers["Concord-Event"] == payload["event"]
    assert len(receiver.received) == 2  # each event once: delivered ones are not sent again
    assert events["job.indexed"]["job_id"] == good["job_id"]
    assert events["job.failed"]["job_id"] == bad["job_id"]
    assert events["job.failed"]["error"]["stage"] == "parse"
    assert {d["last_status"] for d in log()} == {204}

    other = key_headers(f"{tenant}-x", ["admin"])
    assert client.get(f"/v1/admin/webhooks/{endpoint}/deliveries", headers=other).status_code == 404
    assert client.get("/v1/admin/webhooks", headers=other).json() == []
    assert client.delete(f"/v1/admin/webhooks/{endpoint}", headers=admin).status_code == 204
    assert client.get(f"/v1/admin/webhooks/{endpoint}/deliveries", headers=admin).status_code == 404


def test_endpoints_refuse_bad_urls_and_unknown_events(client: TestClient, tenant: str) -> None:
    admin = key_headers(tenant, ["admin"])
    for body in (
        {"url": "ftp://example.org/hook", "events": ["job.indexed"]},
        {"url": "http://127.0.0.1:9/hook", "events": ["job.exploded"]},
        {"url": "http://127.0.0.1:9/hook", "events": []},
    ):
        assert client.post("/v1/admin/webhooks", json=body, headers=admin).status_code == 422
    bad_port = {"url": "http://127.0.0.1:notaport/hook", "events": ["job.indexed"]}
    refused = client.post("/v1/admin/webhooks", json=bad_port, headers=admin)
    assert refused.status_code == 400 and "cannot be sent to" in refused.json()["error"]["message"]
    reader = key_headers(tenant, ["read"])
    body = {"url": "http://127.0.0.1:9/hook", "events": ["job.indexed"]}
    assert client.post("/v1/admin/webhooks", json=body, headers=reader).status_code == 403


def test_a_tenant_has_a_bounded_number_of_endpoints(client: TestClient, tenant: str) -> None:
    """Every finished job writes a delivery per endpoint: a tenant's endpoints are bounded,
    and another tenant's are not counted against it."""
    from shared.webhooks.service import MAX_ENDPOINTS_PER_TENANT

    admin = key_headers(tenant, ["admin"])
    body = {"url": "http://127.0.0.1:9/hook", "events": ["job.indexed"]}
    for _ in range(MAX_ENDPOINTS_PER_TENANT):
        assert client.post("/v1/admin/webhooks", json=body, headers=admin).status_code == 201
    refused = client.post("/v1/admin/webhooks", json=body, headers=admin)
    assert refused.status_code == 409 and "at most" in refused.json()["error"]["message"]
    other = key_headers(f"{tenant}-b", ["admin"])
    assert client.post("/v1/admin/webhooks", json=body, headers=other).status_code == 201
    first = client.get("/v1/admin/webhooks", headers=admin).json()[0]["id"]
    assert client.delete(f"/v1/admin/webhooks/{first}", headers=admin).status_code in (200, 204)
    assert client.post("/v1/admin/webhooks", json=body, headers=admin).status_code == 201


def test_a_dead_endpoint_of_one_tenant_costs_one_attempt_per_run_and_others_are_delivered(
    client: TestClient, tenant: str, worker: Any
) -> None:
    """Tenant A's endpoint never answers and has many deliveries due; tenant B's is up. One
    run (in this process, the worker paused so it does not race) tries A once, defers the
    rest untouched, and delivers all of B's."""
    from shared.db import unit_of_work
    from shared.settings import get_settings
    from shared.webhooks import service as webhooks
    from shared.webhooks.delivery import deliver_due
    from tests.helpers import paused

    receiver = Receiver()
    receiver.start()
    other = f"{tenant}-b"
    try:
        dead = register(client, tenant, "http://127.0.0.1:9/hangs-up")
        live = register(client, other, receiver.url)
        with paused(worker):
            with unit_of_work() as uow:
                events = [(t, "job.indexed", {"n": i}) for i in range(5) for t in (tenant, other)]
                webhooks.emit(uow, events)
            sent = deliver_due(unit_of_work, get_settings())
            with unit_of_work() as uow:  # read before the worker resumes and sends again
                dead_log = webhooks.delivery_log(uow.session, tenant, uuid.UUID(dead), 50)
                live_log = webhooks.delivery_log(uow.session, other, uuid.UUID(live), 50)
    finally:
        receiver.stop()
    assert sorted(d.attempts for d in dead_log) == [0, 0, 0, 0, 1]
    assert all(d.state == "pending" for d in dead_log)
    assert all(d.state == "delivered" for d in live_log) and len(receiver.received) == 5
    # The run's totals count every tenant's due deliveries (earlier tests leave some behind).
    assert sent.delivered >= 5 and sent.retrying >= 1 and sent.deferred >= 4


class HostileReceiver:
    """``/trickle`` answers a header one byte every 0.5 s for a minute (each read well inside
    any per-read timeout); ``/nul`` refuses with a NUL in its answer."""

    def __init__(self) -> None:
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _handler() -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/nul":
                    self.send_response(500)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"bad\x00 news")
                    return
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    for _ in range(120):  # a header that never ends
                        self.wfile.write(b"z")
                        self.wfile.flush()
                        time.sleep(0.5)
                except OSError:  # the sender gave up and closed the connection
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_trickling_or_nul_answering_receiver_costs_one_bounded_attempt_each(
    client: TestClient, tenant: str, worker: Any
) -> None:
    """Under the shipped settings: a receiver that trickles its answer cannot hold the sender
    past ``webhook_timeout_s`` (a per-read timeout alone let it run to the task's time limit,
    holding the one relay worker), and one whose refusal holds a NUL is recorded like any
    other (the error's write used to fail, and with it the rest of the claimed batch, every
    tenant's). Another tenant's deliveries in the same run are delivered."""
    from shared.db import unit_of_work
    from shared.settings import get_settings
    from shared.webhooks import service as webhooks
    from shared.webhooks.delivery import deliver_due
    from tests.helpers import paused

    settings = get_settings()
    hostile, receiver = HostileReceiver(), Receiver()
    receiver.start()
    other = f"{tenant}-b"
    try:
        endpoints = {
            path: register(client, tenant, f"{hostile.base}/{path}") for path in ("trickle", "nul")
        }
        live = register(client, other, receiver.url)
        with paused(worker):
            with unit_of_work() as uow:
                webhooks.emit(
                    uow, [(t, "job.indexed", {"n": i}) for i in range(3) for t in (tenant, other)]
                )
            started = time.monotonic()
            deliver_due(unit_of_work, settings)
            took = time.monotonic() - started
            with unit_of_work() as uow:
                logs = {
                    path: webhooks.delivery_log(uow.session, tenant, uuid.UUID(e), 50)
                    for path, e in endpoints.items()
                }
                live_log = webhooks.delivery_log(uow.session, other, uuid.UUID(live), 50)
    finally:
        hostile.stop()
        receiver.stop()
    assert took < settings.webhook_timeout_s + 4, took  # one trickle, cut at the timeout
    for path, log in logs.items():
        assert sorted(d.attempts for d in log) == [0, 0, 1], path  # tried once, rest deferred
        assert all(d.state == "pending" for d in log)
    (trickled,) = [d for d in logs["trickle"] if d.attempts]
    assert trickled.last_error == f"no complete answer within {settings.webhook_timeout_s:g} s"
    (refused,) = [d for d in logs["nul"] if d.attempts]
    assert refused.last_status == 500 and refused.last_error == "HTTP 500: bad  news"
    assert all(d.state == "delivered" for d in live_log) and len(receiver.received) == 3
