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
        dead = client.post(
            "/v1/admin/webhooks",
            json={"url": "http://127.0.0.1:9/hangs-up", "events": ["job.indexed"]},
            headers=key_headers(tenant, ["admin"]),
        ).json()["id"]
        live = client.post(
            "/v1/admin/webhooks",
            json={"url": receiver.url, "events": ["job.indexed"]},
            headers=key_headers(other, ["admin"]),
        ).json()["id"]
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
