"""What MCP adds to a search: the same queries through ``POST /v1/search`` and through the MCP
``search`` tool (the official SDK's client, Streamable HTTP, one session as an assistant
keeps), interleaved, against the running stack's API, with the tool's options (top_k 5,
hybrid). Each query is sent once by each path, which goes first alternating, so the query
embedding cache favours neither. Prints p50/p95 of each and the difference.

    .venv/bin/concord stack up
    .venv/bin/python bench/mcp_overhead.py --queries 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from concord_client import Concord  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from shared.db import unit_of_work  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.tenants.service import create_key, revoke_key  # noqa: E402

SCIFACT = ROOT.parent / "shared" / "datasets" / "scifact"
TENANT = "bench-mcp"


def _jsonl(path: Path, limit: int) -> list[dict]:
    rows = []
    with path.open() as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == limit:
                break
    return rows


def fill(client: Concord, documents: int) -> None:
    """The tenant's corpus: the first SciFact abstracts, uploaded once."""
    present = sum(1 for _ in client.iter_documents(page_size=1000))
    if present >= documents:
        return
    jobs = []
    for doc in _jsonl(SCIFACT / "corpus.jsonl", documents)[present:]:
        accepted = client.upload_text(doc["_id"], doc["text"], title=doc.get("title", ""))
        jobs.append(accepted.job_id)
    for i, job_id in enumerate(jobs, 1):
        client.wait_for_job(job_id, timeout=600)
        if i % 50 == 0:
            print(f"  indexed {i}/{len(jobs)}", flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def measure(url: str, key: str, queries: list[str]) -> dict[str, list[float]]:
    headers = {"Authorization": f"Bearer {key}"}
    timings: dict[str, list[float]] = {"http": [], "mcp": []}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as mcp_http,
        streamable_http_client(f"{url}/mcp", http_client=mcp_http) as (read, write, *_),
        ClientSession(read, write) as session,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http,
    ):
        await session.initialize()

        async def via_http(query: str) -> None:
            started = time.perf_counter()
            response = await http.post("/v1/search", json={"query": query, "top_k": 5})
            response.raise_for_status()
            timings["http"].append((time.perf_counter() - started) * 1000)

        async def via_mcp(query: str) -> None:
            started = time.perf_counter()
            result = await session.call_tool("search", {"query": query, "top_k": 5})
            assert not result.is_error, result.content
            timings["mcp"].append((time.perf_counter() - started) * 1000)

        for query in queries[:10]:  # warm-up, not counted
            await via_http(query)
            await via_mcp(query)
        timings = {"http": [], "mcp": []}
        for i, query in enumerate(queries[10:]):
            first, second = (via_http, via_mcp) if i % 2 == 0 else (via_mcp, via_http)
            await first(query)
            await second(query)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--documents", type=int, default=300)
    args = parser.parse_args()
    url = get_settings().api_url()
    with unit_of_work() as uow:
        key, secret = create_key(uow.session, TENANT, "bench-mcp", ["read", "write"])
        key_id = key.id
    try:
        with Concord(url, secret) as client:
            fill(client, args.documents)
        queries = [q["text"] for q in _jsonl(SCIFACT / "queries.jsonl", args.queries + 10)]
        timings = asyncio.run(measure(url, secret, queries))
    finally:
        with unit_of_work() as uow:
            revoke_key(uow.session, key_id)
    http, mcp = timings["http"], timings["mcp"]
    print(f"{len(http)} queries each, {args.documents} SciFact abstracts, top_k 5, hybrid")
    print(f"{'path':6} {'p50 ms':>8} {'p95 ms':>8}")
    for name, values in timings.items():
        print(f"{name:6} {statistics.median(values):8.1f} {percentile(values, 95):8.1f}")
    added = [m - h for m, h in zip(mcp, http, strict=True)]
    print(
        f"MCP adds {statistics.median(mcp) - statistics.median(http):.1f} ms at p50 "
        f"(per query, median of the differences {statistics.median(added):.1f} ms); "
        f"p50 ratio {statistics.median(mcp) / statistics.median(http):.2f}"
    )


if __name__ == "__main__":
    main()
