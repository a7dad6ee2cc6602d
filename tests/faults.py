"""Fault injection for the reliability suite: a TCP proxy with switchable link faults, and an
HTTP proxy for Elasticsearch that fails single items of a bulk request.

Both run in threads of the test process and sit between Concord and a real store; the
stores themselves are never modified."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpFaultProxy:
    """Forwards 127.0.0.1:<port> to a target, with one fault at a time:

    - ``pass``: forward untouched
    - ``latency``: delay every chunk of bytes by ``latency_s``
    - ``reset``: close both sides once ``reset_after`` bytes went through a connection
    - ``blackhole``: accept connections and then never answer (nor forward)
    - ``refuse``: close new connections at once
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = "pass"
        self.latency_s = 0.0
        self.reset_after = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def set(self, mode: str, *, latency_s: float = 0.0, reset_after: int = 0) -> None:
        self.mode, self.latency_s, self.reset_after = mode, latency_s, reset_after
        if mode in ("reset", "refuse", "blackhole"):
            self.drop_connections()

    def drop_connections(self) -> None:
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self.drop_connections()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            if self.mode == "refuse":
                _close(client)
                continue
            if self.mode == "blackhole":
                with self._lock:
                    self._open.add(client)  # held open, never read: accept-then-silence
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            # The 5 s bound is for connecting only. Left on the socket, it cut every
            # connection whose server side was quiet for 5 s (a Celery worker's broker link
            # while its task runs), so "pass" was no pass and the worker redelivered its task
            # again and again on a loaded machine.
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            budget = [self.reset_after] if self.mode == "reset" else None
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, budget), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, budget: list[int] | None) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.mode == "latency":
                    time.sleep(self.latency_s)
                if budget is not None:
                    budget[0] -= len(data)
                    if budget[0] < 0:
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class BulkFaults:
    """Per-item faults for ``_bulk`` requests, chosen by a seeded random draw per item."""

    rates: dict[int, float]  # status -> probability, e.g. {429: 0.1, 409: 0.05, 400: 0.03}
    seed: int = 7
    permanent_400: set[str] = field(default_factory=set)  # chunk ids that always fail 400
    sent: Counter[str] = field(default_factory=Counter)  # chunk id -> times it came through
    injected: Counter[int] = field(default_factory=Counter)
    applied: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.lock = threading.Lock()

    def draw(self, chunk_id: str) -> int | None:
        with self.lock:
            self.sent[chunk_id] += 1
            if chunk_id in self.permanent_400:
                return 400
            roll, edge = self.rng.random(), 0.0
            for status, rate in sorted(self.rates.items()):
                edge += rate
                if roll < edge:
                    if status == 400:
                        self.permanent_400.add(chunk_id)  # a mapping error does not go away
                    return status
            return None


class BulkFaultProxy:
    """An HTTP proxy for Elasticsearch that forwards everything, except that each item of a
    ``_bulk`` request may get an injected result instead: 429 or 503 (not forwarded), 400 (a
    mapping error, not forwarded), or 409 (forwarded and applied, then reported as a version
    conflict, as a duplicate delivery would be)."""

    def __init__(self, target: str, faults: BulkFaults) -> None:
        self.target = target.rstrip("/")
        self.faults = faults
        self.http = httpx.Client(timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, payload = proxy.handle(self.command, self.path, self.headers, body)
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.http.close()

    def _send(self, method: str, path: str, headers: Any, body: bytes) -> httpx.Response:
        keep = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        return self.http.request(method, self.target + path, headers=keep, content=body)

    def handle(
        self, method: str, path: str, headers: Any, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if not path.split("?")[0].endswith("/_bulk"):
            response = self._send(method, path, headers, body)
            return response.status_code, dict(response.headers), response.content
        lines = [line for line in body.split(b"\n") if line.strip()]
        items: list[tuple[bytes, bytes | None]] = []
        i = 0
        while i < len(lines):
            action = json.loads(lines[i])
            if "delete" in action:
                items.append((lines[i], None))
                i += 1
            else:
                items.append((lines[i], lines[i + 1]))
                i += 2
        verdicts = [self.faults.draw(_item_id(a)) for a, _ in items]
        forwarded = [item for item, v in zip(items, verdicts, strict=True) if v in (None, 409)]
        results: list[dict[str, Any]] = []
        if forwarded:
            payload = b"\n".join(b"\n".join(p for p in pair if p is not None) for pair in forwarded)
            response = self._send(method, path, headers, payload + b"\n")
            results = response.json()["items"]
        merged, cursor = [], 0
        for (action_line, _), verdict in zip(items, verdicts, strict=True):
            op = next(iter(json.loads(action_line)))
            chunk_id = _item_id(action_line)
            if verdict in (None, 409):
                real = results[cursor]
                cursor += 1
                if int(next(iter(real.values())).get("status", 500)) < 300:
                    self.faults.applied.add(chunk_id)
                if verdict is None:
                    merged.append(real)
                    continue
            with self.faults.lock:
                self.faults.injected[verdict] += 1
            merged.append({op: _fake_result(chunk_id, verdict)})
        out = {"took": 1, "errors": any(v is not None for v in verdicts), "items": merged}
        headers = {"content-type": "application/json", "x-elastic-product": "Elasticsearch"}
        return 200, headers, json.dumps(out).encode()


def _item_id(action_line: bytes) -> str:
    action = json.loads(action_line)
    return str(next(iter(action.values()))["_id"])


def _fake_result(chunk_id: str, status: int) -> dict[str, Any]:
    kind = {
        429: "es_rejected_execution_exception",
        503: "unavailable_shards_exception",
        400: "document_parsing_exception",
        409: "version_conflict_engine_exception",
    }[status]
    return {
        "_id": chunk_id,
        "status": status,
        "error": {"type": kind, "reason": f"injected by the fault proxy ({status})"},
    }
