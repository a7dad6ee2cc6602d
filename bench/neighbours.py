"""Noisy neighbours: what one tenant's load costs another, through the real stack.

A victim tenant's two figures, measured idle and then under each load of a noisy tenant (or
client), one load at a time:

- **upload-to-searchable**: a small upload (POST /v1/documents) until a lexical search for
  its unique word finds it;
- **search latency**: p50/p95 of the victim's searches, one after another.

The loads:

- ``hanging``: 20 webhook endpoints of the noisy tenant that accept a connection and never
  answer, with deliveries kept coming (the noisy tenant uploads a document a second);
- ``backlog``: the noisy tenant's queued ingest of ~20,000 chunks (``--backlog-chunks``);
- ``flood-150k`` and ``flood-600k``: the noisy tenant uploads a folder of ordinary documents
  through the API, 160 of about 150 KB, or 30 of about 600 KB (each over a whole batch's
  bytes), as fast as it is answered, while the victim uploads its probe;
- ``search-flood``: 6 threads of the noisy tenant searching as fast as they are answered;
- ``wrong-keys``: 4 threads sending well-formed wrong keys as fast as answered, from another
  client address (``X-Forwarded-For``: uvicorn takes it from 127.0.0.1, as from a proxy).

Run it against the stack the README's first command brings up, with its shipped settings,
plus one the hanging-endpoint load needs (its listener is on this machine, which egress
control refuses otherwise):

    CONCORD_WEBHOOK_ALLOWED_NETWORKS=127.0.0.1/32 .venv/bin/concord stack up
    .venv/bin/python bench/neighbours.py

Each figure is printed and written to bench/results/neighbours.json; ratios are taken within
one run (the machine's two cores are shared, so absolute figures move between runs).
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.db import unit_of_work  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.tenants.service import create_key, revoke_key  # noqa: E402

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]
QUERIES = [
    "how do tides follow the moon",
    "glacier retreat and sea level",
    "what makes volcanic soil fertile",
    "migration routes of arctic terns",
    "the chemistry of baking bread",
    "why is the sky blue at noon",
]


class Tenant:
    """A tenant of the run: a fresh id and a key with every scope, revoked at the end."""

    def __init__(self, name: str) -> None:
        self.id = f"bench-{name}-{uuid.uuid4().hex[:8]}"
        with unit_of_work() as uow:
            key, self.secret = create_key(uow.session, self.id, "bench", ["read", "write", "admin"])
            self.key_id = key.id
        self.headers = {"Authorization": f"Bearer {self.secret}"}

    def revoke(self) -> None:
        with unit_of_work() as uow:
            revoke_key(uow.session, self.key_id)


def prose(seed: int, sentences: int) -> str:
    out = []
    for i in range(sentences):
        words = [WORDS[(seed * 7 + i * 3 + j) % len(WORDS)] for j in range(12)]
        out.append(" ".join(words).capitalize() + f" note {seed}-{i}.")
    return " ".join(out)


def upload_to_searchable(http: httpx.Client, victim: Tenant, timeout_s: float = 180) -> float:
    """Seconds from a small upload's POST until a lexical search finds its unique word."""
    word = f"zq{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    answer = http.post(
        "/v1/documents",
        headers=victim.headers,
        json={"external_id": f"probe-{word}", "text": f"The probe word is {word}. " + prose(1, 3)},
    )
    answer.raise_for_status()
    body = {"query": word, "mode": "lexical", "top_k": 1}
    while time.monotonic() - started < timeout_s:
        found = http.post("/v1/search", headers=victim.headers, json=body)
        if found.status_code == 200 and found.json()["results"]:
            return time.monotonic() - started
        time.sleep(0.1)
    return float("inf")


def search_latencies(http: httpx.Client, victim: Tenant, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        body = {"query": QUERIES[i % len(QUERIES)], "mode": "hybrid", "top_k": 10}
        started = time.perf_counter()
        answer = http.post("/v1/search", headers={**victim.headers, "Cache-Control": "no-cache"},
                           json=body)  # fmt: skip
        latencies.append((time.perf_counter() - started) * 1e3)
        if answer.status_code != 200:
            raise RuntimeError(f"the victim's search answered {answer.status_code}: {answer.text}")
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(http: httpx.Client, victim: Tenant, args: argparse.Namespace) -> dict[str, float]:
    searchable = [upload_to_searchable(http, victim) for _ in range(args.uploads)]
    latencies = search_latencies(http, victim, args.searches)
    return {
        "upload_to_searchable_s": round(statistics.median(searchable), 2),
        "upload_to_searchable_max_s": round(max(searchable), 2),
        "search_p50_ms": round(percentile(latencies, 0.5), 1),
        "search_p95_ms": round(percentile(latencies, 0.95), 1),
    }


# ---------------------------------------------------------------- the loads


class HangingListener:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


def _keep_running(work: Callable[[], None], threads: int) -> Callable[[], Iterator[None]]:
    @contextmanager
    def load() -> Iterator[None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                with suppress(httpx.HTTPError):
                    work()

        runners = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
        for runner in runners:
            runner.start()
        try:
            yield
        finally:
            stop.set()
            for runner in runners:
                runner.join(timeout=30)

    return load


@contextmanager
def hanging_endpoints(http: httpx.Client, noisy: Tenant, count: int = 20) -> Iterator[None]:
    listener = HangingListener()
    ids = []
    for i in range(count):
        created = http.post(
            "/v1/admin/webhooks",
            headers=noisy.headers,
            json={"url": f"http://127.0.0.1:{listener.port}/hook/{i}", "events": ["job.indexed"]},
        )
        if created.status_code != 201:
            raise SystemExit(
                f"registering a local endpoint answered {created.status_code}: {created.text}\n"
                "start the stack with CONCORD_WEBHOOK_ALLOWED_NETWORKS=127.0.0.1/32 (see the "
                "docstring)"
            )
        ids.append(created.json()["id"])
    counter = iter(range(10**9))

    def upload() -> None:
        n = next(counter)
        http.post("/v1/documents", headers=noisy.headers,
                  json={"external_id": f"hook-{n}", "text": prose(n, 4)})  # fmt: skip
        time.sleep(1.0)

    try:
        with _keep_running(upload, 1)():
            time.sleep(15)  # deliveries pile up and hang before the victim measures
            yield
    finally:
        for endpoint in ids:
            http.delete(f"/v1/admin/webhooks/{endpoint}", headers=noisy.headers)
        listener.close()


@contextmanager
def ingest_backlog(http: httpx.Client, noisy: Tenant, chunks: int) -> Iterator[None]:
    """About ``chunks`` chunks queued at once: documents of ~40 chunks, uploaded in one
    upload-events message each 50 (what `concord ingest` sends)."""
    from shared.queue import publish_upload_events

    per_document = 40
    documents = max(1, chunks // per_document)
    events = [
        {
            "schema": "concord.upload/v1",
            "tenant_id": noisy.id,
            "external_id": f"backlog-{i}",
            "content_type": "text/plain",
            "content_base64": base64.b64encode(prose(i, per_document * 9).encode()).decode(),
        }
        for i in range(documents)
    ]
    for start in range(0, len(events), 50):
        publish_upload_events(events[start : start + 50])
    time.sleep(5)  # the events are accepted, the jobs queued
    try:
        yield
    finally:
        settle(noisy)


@contextmanager
def document_flood(http: httpx.Client, noisy: Tenant, count: int, size: int) -> Iterator[None]:
    """``count`` documents of about ``size`` bytes uploaded by the noisy tenant through the
    API, one after another as fast as answered (a folder synced), then the victim measured
    while they are queued; a 429 (the tenant's queued bytes) is waited out as asked."""
    sentences = max(1, size // 85)  # prose() writes about 85 bytes a sentence
    sent = 0
    while sent < count:
        answer = http.post(
            "/v1/documents",
            headers=noisy.headers,
            json={"external_id": f"flood-{size}-{sent}", "text": prose(sent + 500, sentences)},
        )
        if answer.status_code == 429:
            time.sleep(float(answer.headers.get("retry-after", "1")))
            continue
        answer.raise_for_status()
        sent += 1
    try:
        yield
    finally:
        settle(noisy)


def settle(noisy: Tenant, timeout_s: float = 900) -> None:
    """Wait until the noisy tenant's ingest has finished (jobs and outbox), so that the next
    load is measured alone."""
    from shared.jobs.repository import job_state_counts
    from shared.outbox.repository import outbox_backlog

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with unit_of_work() as uow:
            counts = job_state_counts(uow.session, noisy.id)
            backlog = outbox_backlog(uow.session, noisy.id)
        if not counts.get("queued") and not counts.get("running") and not backlog:
            return
        time.sleep(2)
    print(f"warning: the noisy tenant's ingest had not settled after {timeout_s:.0f} s")


def search_flood(http: httpx.Client, noisy: Tenant) -> Callable[[], Iterator[None]]:
    counter = iter(range(10**9))
    client = httpx.Client(base_url=http.base_url, timeout=60)

    def one() -> None:
        body = {"query": QUERIES[next(counter) % len(QUERIES)], "mode": "hybrid", "top_k": 10}
        answer = client.post("/v1/search", json=body,
                             headers={**noisy.headers, "Cache-Control": "no-cache"})  # fmt: skip
        if answer.status_code == 429:
            time.sleep(float(answer.headers.get("retry-after", "1")))

    return _keep_running(one, 6)


def wrong_key_flood(http: httpx.Client) -> Callable[[], Iterator[None]]:
    client = httpx.Client(base_url=http.base_url, timeout=60)

    def one() -> None:
        wrong = "ck_" + uuid.uuid4().hex + uuid.uuid4().hex[:11]
        client.post("/v1/search", json={"query": "x"},
                    headers={"Authorization": f"Bearer {wrong}",
                             "X-Forwarded-For": "203.0.113.66"})  # fmt: skip

    return _keep_running(one, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uploads", type=int, default=3, help="probes per figure")
    parser.add_argument("--searches", type=int, default=60, help="victim searches per figure")
    parser.add_argument("--backlog-chunks", type=int, default=20_000)
    parser.add_argument(
        "--loads", default="hanging,backlog,flood-150k,flood-600k,search-flood,wrong-keys"
    )
    args = parser.parse_args()

    http = httpx.Client(base_url=get_settings().api_url(), timeout=120)
    victim, noisy = Tenant("victim"), Tenant("noisy")
    try:
        for i in range(20):  # a corpus for the victim's searches
            http.post("/v1/documents", headers=victim.headers,
                      json={"external_id": f"base-{i}", "text": prose(i + 100, 20)})  # fmt: skip
        upload_to_searchable(http, victim)  # the victim's index exists and is warm
        results: dict[str, dict[str, float]] = {"idle": measure(http, victim, args)}
        print("idle", results["idle"], flush=True)
        loads: dict[str, Callable[[], Any]] = {
            "hanging": lambda: hanging_endpoints(http, noisy),
            "backlog": lambda: ingest_backlog(http, noisy, args.backlog_chunks),
            "flood-150k": lambda: document_flood(http, noisy, 160, 150_000),
            "flood-600k": lambda: document_flood(http, noisy, 30, 600_000),
            "search-flood": search_flood(http, noisy),
            "wrong-keys": wrong_key_flood(http),
        }
        for name in args.loads.split(","):
            with loads[name]():
                results[name] = measure(http, victim, args)
            print(name, results[name], flush=True)
    finally:
        victim.revoke()
        noisy.revoke()
    idle = results["idle"]
    print("\n| load | upload-to-searchable s (median, max) | search p50 ms | p95 ms | p95 / idle |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['upload_to_searchable_s']}, {r['upload_to_searchable_max_s']} | "
            f"{r['search_p50_ms']} | {r['search_p95_ms']} | "
            f"{r['search_p95_ms'] / idle['search_p95_ms']:.2f} |"
        )
    out = ROOT / "bench" / "results" / "neighbours.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
