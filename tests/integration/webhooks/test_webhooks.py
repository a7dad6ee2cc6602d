"""Webhooks end to end, with the shipped retry settings: a real local receiver that is down
when the jobs finish gets every event once it is back up, each signed (HMAC-SHA256 over the
timestamp, the delivery id and the body) and logged per endpoint with its attempts; a tenant
sees only its own."""

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
from tests.helpers import key_headers, suite_queue, upload_text, wait_job


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
    wait_for(lambda: (len(log()) == 2 and all(d["attempts"] >= 1 for d in log())) or None, 60,
             what="a failed attempt each while the receiver is down")  # fmt: skip
    for delivery in log():
        assert delivery["state"] == "pending" and delivery["next_attempt_at"]
        assert delivery["last_error"].startswith("connect_failed")
    assert receiver.received == []

    receiver.start()
    try:  # within the retry's backoff, or the breaker's parking if it tripped meanwhile
        wait_for(lambda: all(d["state"] == "delivered" for d in log()) or None, 90,
                 what="both deliveries once the receiver is up")  # fmt: skip
    finally:
        receiver.stop()
    events = {}
    for headers, body in receiver.received:
        signature, delivery_id = headers["Concord-Signature"], headers["Concord-Delivery"]
        assert verify(secret, signature, body, delivery_id)
        assert not verify("whsec_wrong", signature, body, delivery_id)
        assert not verify(secret, signature, body, delivery_id, now=time.time() + 3600)
        # the id is signed: a captured delivery resent under a new id does not verify
        assert not verify(secret, signature, body, str(int(delivery_id) + 1))
        assert not verify(secret, signature, body)
        payload = json.loads(body)
        events[payload["event"]] = payload
        assert headers["Concord-Event"] == payload["event"]
    assert len(receiver.received) == 2  # each event once: delivered ones are not sent again
    assert events["job.indexed"]["job_id"] == good["job_id"]
    assert events["job.indexed"]["external_id"] == "tide"
    assert events["job.failed"]["job_id"] == bad["job_id"]
    assert events["job.failed"]["external_id"] == "empty.html"
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
    for url in ("http://127.0.0.1:notaport/hook", "http://xn--/hook"):
        bad = {"url": url, "events": ["job.indexed"]}
        refused = client.post("/v1/admin/webhooks", json=bad, headers=admin)
        assert refused.status_code == 422, (url, refused.text)
        assert "cannot be sent to" in refused.json()["error"]["message"]
    out_of_range = {"url": "http://127.0.0.1:99999/hook", "events": ["job.indexed"]}
    refused = client.post("/v1/admin/webhooks", json=out_of_range, headers=admin)
    assert refused.status_code == 422 and "1-65535" in refused.json()["error"]["message"]
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


def test_a_dead_endpoint_of_one_tenant_costs_its_share_of_attempts_and_others_are_delivered(
    client: TestClient, tenant: str, webhook_worker: Any
) -> None:
    """Tenant A's endpoint never answers and has many deliveries due; tenant B's is up. One
    run (in this process, the webhook worker paused so it does not race) tries A's endpoint
    with at most its share of requests at once, not again once they failed, leaves the rest
    untouched, and delivers all of B's."""
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
        with paused(webhook_worker):
            with unit_of_work() as uow:
                events = [(t, "job.indexed", {"n": i}) for i in range(5) for t in (tenant, other)]
                webhooks.emit(uow, events, queue=suite_queue())
            sent = deliver_due(unit_of_work, get_settings())
            with unit_of_work() as uow:  # read before the worker resumes and sends again
                dead_log = webhooks.delivery_log(uow.session, tenant, uuid.UUID(dead), 50)
                live_log = webhooks.delivery_log(uow.session, other, uuid.UUID(live), 50)
    finally:
        receiver.stop()
    share = get_settings().webhook_endpoint_in_flight
    tried = [d for d in dead_log if d.attempts]
    assert len(tried) == share and all(d.attempts == 1 for d in tried)
    assert all(d.state == "pending" for d in dead_log)
    assert all(d.state == "delivered" for d in live_log) and len(receiver.received) == 5
    # The run's totals count every tenant's due deliveries (earlier tests leave some behind).
    assert sent.delivered >= 5 and sent.retrying >= share


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
    client: TestClient, tenant: str, webhook_worker: Any
) -> None:
    """Under the shipped settings: a receiver that trickles its answer cannot hold the sender
    past ``webhook_timeout_s`` (a per-read timeout alone let it run to the task's time limit),
    and one whose refusal holds a NUL is recorded with its status and Concord's own words,
    nothing of its body. Another tenant's deliveries in the same run are delivered."""
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
        with paused(webhook_worker):
            with unit_of_work() as uow:
                webhooks.emit(
                    uow,
                    [(t, "job.indexed", {"n": i}) for i in range(3) for t in (tenant, other)],
                    queue=suite_queue(),
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
    share = settings.webhook_endpoint_in_flight
    for path, log in logs.items():  # tried with its share at once, not again in the run
        assert sorted(d.attempts for d in log) == [0] * (3 - share) + [1] * share, path
        assert all(d.state == "pending" for d in log)
    for trickled in [d for d in logs["trickle"] if d.attempts]:
        limit = settings.webhook_timeout_s
        assert trickled.last_error == f"timeout: no complete answer within {limit:g} s"
    for refused in [d for d in logs["nul"] if d.attempts]:
        assert refused.last_status == 500
        assert refused.last_error == "http_status: the receiver answered 500"  # no body
    assert all(d.state == "delivered" for d in live_log) and len(receiver.received) == 3


class HangingListener:
    """Accepts connections and never answers (until closed)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_hanging_endpoints_of_one_tenant_hold_only_its_own_slots_and_get_parked(
    client: TestClient, tenant: str, webhook_worker: Any
) -> None:
    """The real webhook worker, shipped settings. Tenant A's six endpoints accept and never
    answer, three deliveries each; tenant B's receiver is up. B's delivery is delivered
    while A's first attempts are still hanging (before any of them is recorded): A holds its
    own slots, not the sender. Each of A's endpoints that keeps timing out is then parked:
    its deliveries wait out the parking without losing attempts."""
    from shared.db import unit_of_work
    from shared.models import WebhookEndpoint
    from shared.settings import get_settings
    from shared.webhooks import service as webhooks

    settings = get_settings()
    hanging, receiver = HangingListener(), Receiver()
    receiver.start()
    other = f"{tenant}-b"
    try:
        endpoints = [uuid.UUID(register(client, tenant, hanging.url)) for _ in range(6)]
        live = uuid.UUID(register(client, other, receiver.url))
        with unit_of_work() as uow:
            webhooks.emit(
                uow, [(tenant, "job.indexed", {"n": i}) for i in range(3)], queue=suite_queue()
            )
        wait_for(lambda: len(hanging.held) >= settings.webhook_tenant_in_flight or None, 30,
                 what="A's first requests hanging")  # fmt: skip
        with unit_of_work() as uow:
            webhooks.emit(uow, [(other, "job.indexed", {"n": 0})], queue=suite_queue())

        def a_log_once_b_is_delivered() -> list[Any] | None:
            with unit_of_work() as uow:
                b_log = webhooks.delivery_log(uow.session, other, live, 10)
                a_log = [d for e in endpoints
                         for d in webhooks.delivery_log(uow.session, tenant, e, 10)]  # fmt: skip
            return a_log if b_log and b_log[0].state == "delivered" else None

        a_log = wait_for(a_log_once_b_is_delivered, 30, what="B's delivery")
        assert all(d.attempts == 0 for d in a_log), "B waited for A's timeouts"
        assert len(hanging.held) <= settings.webhook_tenant_in_flight  # A's share, no more

        def parked() -> list[WebhookEndpoint] | None:
            with unit_of_work() as uow:
                rows = [uow.session.get(WebhookEndpoint, e) for e in endpoints]
                tripped = [r for r in rows if r is not None and r.parked_until is not None]
                uow.session.expunge_all()
                return tripped or None

        tripped = wait_for(parked, 90, what="a hanging endpoint parked by the breaker")
        endpoint = tripped[0]
        assert endpoint.consecutive_failures >= settings.webhook_breaker_failures
        with unit_of_work() as uow:
            waiting = webhooks.delivery_log(uow.session, tenant, endpoint.id, 10)
        assert all(d.state == "pending" for d in waiting)
        assert all(d.next_attempt_at >= endpoint.parked_until for d in waiting)
        assert sum(d.attempts for d in waiting) <= endpoint.consecutive_failures
        assert all(d.last_error is None or d.last_error.startswith("timeout") for d in waiting)
    finally:
        with unit_of_work() as uow:  # the rest is never delivered: stop the sender trying
            for e in endpoints:
                webhooks.delete_endpoint(uow.session, tenant, e)
        hanging.close()
        receiver.stop()
