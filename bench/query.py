"""Query latency benchmark: p50/p95/p99 per mode at several corpus sizes, through the real API.

For each size it fills a dedicated tenant with that many chunks (once; later runs reuse it),
starts its own API process (so the rerank stage can be configured), and sends real SciFact
queries over HTTP: a disjoint slice of queries per mode, so no mode profits from another's
query-embedding cache. Stage shares come from the API's own per-stage timings.

Synthetic chunks: real SciFact passages are embedded once (``--base`` of them); each synthetic
chunk joins two of them (text and normalized vector sum, plus a little noise), so the vectors
keep the real model's geometry while the corpus grows to 100k chunks in minutes, not hours.

    .venv/bin/concord stack up --infra-only
    .venv/bin/python bench/query.py --sizes 10000,100000

``--against DIR`` compares this checkout with another (an earlier build's worktree, run by
this checkout's virtual environment) on the same stack and tenant: both APIs run at once and
answer each query in turn, the first to be asked alternating, so both meet the same load of
a shared, noisy machine. It prints each build's figures and their ratios (this build over
the other), and the median of the per-query ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from elasticsearch import helpers
from sqlalchemy import func, insert, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evaluation.harness import temporary_key  # noqa: E402
from evaluation.runner import SearchClient  # noqa: E402
from services.cli.stack import api_command  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.ingest.embedding import get_embedder  # noqa: E402
from shared.ingest.steps import text_hash  # noqa: E402
from shared.models import Chunk, Document, DocumentVersion  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.stores.buckets import bucket_of, fingerprint  # noqa: E402
from shared.stores.chunk_index import ElasticsearchChunkIndex  # noqa: E402
from shared.stores.elastic import get_es  # noqa: E402
from shared.stores.english_analysis import analyze  # noqa: E402
from shared.stores.es_index import tenant_alias  # noqa: E402
from shared.stores.filters import range_terms  # noqa: E402
from shared.stores.partitions import partition_name, place_tenants  # noqa: E402
from shared.stores.repository import placement_unlock, try_placement_lock  # noqa: E402
from shared.tenants import repository as tenants_repo  # noqa: E402

CHUNKS_PER_DOCUMENT = 10
MODES: dict[str, dict[str, Any]] = {
    "dense": {"mode": "dense"},
    "lexical": {"mode": "lexical"},
    "hybrid": {"mode": "hybrid"},
    "hybrid+rerank": {
        "mode": "hybrid",
        "rerank": {"enabled": True, "window": 10, "budget_ms": 5000},
    },
}


def base_passages(dataset: Path, count: int) -> list[str]:
    passages = []
    with (dataset / "corpus.jsonl").open() as f:
        for line in f:
            doc = json.loads(line)
            words = doc["text"].split()
            passages.append(" ".join(words[:120]))
            if len(passages) == count:
                break
    return passages


def chunk_count(tenant: str) -> int:
    with unit_of_work() as uow:
        return (
            uow.session.scalar(
                select(func.count()).select_from(Chunk).where(Chunk.tenant_id == tenant)
            )
            or 0
        )


def drop_tenant(tenant: str) -> None:
    """Remove a (partial) benchmark tenant from both stores."""
    from sqlalchemy import delete

    with unit_of_work() as uow:
        uow.session.execute(delete(Document).where(Document.tenant_id == tenant))
    # The integ-test distribution has no _delete_by_query (reindex module): scan and delete.
    es, alias = get_es(), tenant_alias(get_settings(), tenant)
    if not es.indices.exists_alias(name=alias):
        return
    hits = helpers.scan(
        es, index=alias, query={"query": {"term": {"tenant_id": tenant}}}, _source=False
    )
    helpers.bulk(
        es,
        ({"_op_type": "delete", "_index": alias, "_id": h["_id"]} for h in hits),
        raise_on_error=False,
    )
    es.indices.refresh(index=alias)


def populate(tenant: str, size: int, texts: list[str], vectors: np.ndarray) -> None:
    """Write ``size`` synthetic chunks to Postgres and Elasticsearch (both stores agree),
    holding the placement lock: a placement run meanwhile (the beat, or a `concord eval` or
    training run syncing its own tenant) would give the half-filled tenant its graph, and
    every later row would then pay an HNSW insert (at 40,000 of a million rows: the fill went
    from 1,800 to 100 chunks/s). Placement waits, and places the full tenant afterwards."""
    with unit_of_work() as guard:
        while not try_placement_lock(guard.session):
            time.sleep(1.0)
        try:
            # A tenant filled again after a partial run may have its own partition already:
            # its graph goes too, and the placement after the fill builds it again.
            graph = f"{partition_name(tenant)}_embedding_hnsw"
            guard.session.execute(text(f"DROP INDEX IF EXISTS {graph}"))
            _fill(tenant, size, texts, vectors)
        finally:
            placement_unlock(guard.session)


def _fill(tenant: str, size: int, texts: list[str], vectors: np.ndarray) -> None:
    rng = np.random.default_rng(size)
    # A synthetic chunk is two base passages joined by a space; word-piece tokens and stemmed
    # terms never cross whitespace, so its counts and terms are the sums of the two passages'
    # (computed once, not per chunk: at a million chunks that is most of the populate time).
    tokenizer = get_embedder().model().tokenizer
    token_counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    stems = [analyze(t) for t in texts]
    es = get_es()
    alias = tenant_alias(get_settings(), tenant)  # the tenant's own index
    assert ElasticsearchChunkIndex().prepare([tenant]) == {}
    started = time.monotonic()
    with unit_of_work() as uow:
        tenants_repo.ensure_tenant(uow.session, tenant)
    for start in range(0, size, 1000):
        docs, versions, chunks, actions = [], [], [], []
        for n in range(start, min(start + 1000, size), CHUNKS_PER_DOCUMENT):
            doc_id = uuid.uuid4()
            docs.append(
                {
                    "id": doc_id,
                    "tenant_id": tenant,
                    "external_id": f"syn-{n}",
                    "title": "",
                    "metadata": {"bucket": n % 10},
                    "version": 1,
                    "content_hash": "synthetic",
                    "deleted": False,
                }
            )
            versions.append(
                {
                    "document_id": doc_id,
                    "version": 1,
                    "tenant_id": tenant,
                    "content_hash": "synthetic",
                    "content_type": "text/plain",
                    "raw": None,
                    "tombstone": False,
                }
            )
            for ordinal in range(min(CHUNKS_PER_DOCUMENT, size - n)):
                i, j = rng.integers(len(texts), size=2)
                text, stemmed = f"{texts[i]} {texts[j]}", f"{stems[i]} {stems[j]}"
                vector = vectors[i] + 0.5 * vectors[j] + rng.normal(0, 0.02, vectors.shape[1])
                vector /= np.linalg.norm(vector)
                cid = f"{doc_id}:{ordinal}"
                copied: dict[str, Any] = {
                    "chunk_id": cid,
                    "tenant_id": tenant,
                    "document_id": str(doc_id),
                    "external_id": f"syn-{n}",
                    "version": 1,
                    "ordinal": ordinal,
                    "text_hash": text_hash(text),
                    "title": "",
                    "section": "",
                    "metadata": {"bucket": n % 10},
                }
                tokens = token_counts[i] + token_counts[j]
                chunks.append(
                    {
                        "id": cid,
                        "tenant_id": tenant,
                        "document_id": doc_id,
                        "version": 1,
                        "ordinal": ordinal,
                        "text": text,
                        "text_hash": text_hash(text),
                        "char_start": 0,
                        "char_end": len(text),
                        "section": "",
                        "token_count": tokens,
                        "bucket": bucket_of(cid),
                        "fingerprint": fingerprint(**copied),
                        "metadata": {"bucket": n % 10},
                        "embedding": vector.tolist(),
                    }
                )
                actions.append(
                    {
                        "_index": alias,
                        "_id": cid,
                        "version": 1,
                        "version_type": "external",
                        "_source": {
                            **copied,
                            "text": text,
                            # The BM25 arm matches these (shared/stores/chunk_document.py).
                            "stemmed": {"title": "", "section": "", "text": stemmed},
                            "metadata_ranges": range_terms({"bucket": n % 10}),
                            "bucket": bucket_of(cid),
                            "fingerprint": fingerprint(**copied),
                        },
                    }
                )
        with unit_of_work() as uow:
            uow.session.execute(insert(Document), docs)
            uow.session.execute(insert(DocumentVersion), versions)
            uow.session.execute(insert(Chunk), chunks)
        helpers.bulk(es, actions, chunk_size=1000, request_timeout=120)
        done = min(start + 1000, size)
        rate = done / (time.monotonic() - started)
        print(f"\rpopulating {tenant}: {done}/{size} chunks ({rate:.0f}/s)", end="", flush=True)
    es.indices.refresh(index=alias)
    print()


def storage(tenant: str) -> dict[str, float]:
    """What the tenant's chunks take in each store (MB), and Elasticsearch's heap in use."""
    partition = partition_name(tenant)
    with unit_of_work() as uow:
        table, total, graph = uow.session.execute(
            text(  # 0 for what does not exist (a tenant left in the shared partition)
                "SELECT coalesce(pg_relation_size(to_regclass(:p)), 0),"
                " coalesce(pg_total_relation_size(to_regclass(:p)), 0),"
                " coalesce(pg_relation_size(to_regclass(:g)), 0)"
            ),
            {"p": partition, "g": f"{partition}_embedding_hnsw"},
        ).one()
    es = get_es()
    index_stats = es.indices.stats(index=tenant_alias(get_settings(), tenant), metric="store")
    heap = sum(
        node["jvm"]["mem"]["heap_used_in_bytes"]
        for node in es.nodes.stats(metric="jvm")["nodes"].values()
    )
    mb = 1024 * 1024
    return {
        "pg_rows_mb": round(table / mb),
        "pg_hnsw_mb": round(graph / mb),
        "pg_total_mb": round(total / mb),
        "es_store_mb": round(index_stats["_all"]["primaries"]["store"]["size_in_bytes"] / mb),
        "es_heap_used_mb": round(heap / mb),
    }


def start_api(port: int, env: dict[str, str], root: Path = ROOT) -> subprocess.Popen[bytes]:
    """An API process of the checkout at ``root`` (this one's by default). Another checkout's
    runs its own code with this one's state directory (the query encoder's ONNX export:
    one it lacked would be exported, or torch used, within the measured run)."""
    (ROOT / "bench/results").mkdir(parents=True, exist_ok=True)  # a fresh clone has none
    log = open(ROOT / "bench/results/query-api.log", "ab")  # noqa: SIM115
    checkout = {}
    if root != ROOT:
        checkout = {"PYTHONPATH": str(root), "CONCORD_STATE_DIR": str(get_settings().state_path())}
    proc = subprocess.Popen(
        api_command("127.0.0.1", port, "--log-level", "warning"),
        cwd=root,
        env={**os.environ, **env, **checkout},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    # Its own answer, not that of a process left on the port by an earlier run.
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the benchmark's API did not start; see bench/results/query-api.log")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Timed:
    """One API's latencies and summed stage timings over a mode's queries."""

    def __init__(self, key: str, port: int) -> None:
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        # Its searches wait out the key's rate limit (a 429) untimed, and send again.
        self.client = SearchClient(key, self.http)
        self.latencies: list[float] = []
        self.stages: dict[str, float] = {}
        self.degraded = 0

    def warm_up(self, queries: list[str], options: dict[str, Any]) -> None:
        for warm in queries[:5]:
            self.client.search({"query": warm + " warm", **options})

    def search(self, query: str, options: dict[str, Any]) -> None:
        # Plain requests (no explain): the stage timings come in the Server-Timing header.
        body, elapsed_ms, stage_ms = self.client.search_with_stages(
            {"query": query, "top_k": 10, **options}
        )
        self.latencies.append(elapsed_ms)
        self.degraded += bool(body["degraded"])
        for stage, ms in stage_ms.items():
            self.stages[stage] = self.stages.get(stage, 0.0) + ms

    def close(self) -> None:
        self.http.close()


def run_mode(port: int, key: str, queries: list[str], options: dict[str, Any]) -> dict[str, Any]:
    timed = Timed(key, port)
    try:
        timed.warm_up(queries, options)
        for query in queries:
            timed.search(query, options)
    finally:
        timed.close()
    return summary(timed.latencies, timed.stages, timed.degraded)


def run_mode_paired(
    ports: tuple[int, int], key: str, queries: list[str], options: dict[str, Any]
) -> dict[str, Any]:
    """Each query to both APIs in turn (the first asked alternating): this build's figures,
    the other's, and the ratios of this one's to the other's."""
    this, other = Timed(key, ports[0]), Timed(key, ports[1])
    try:
        this.warm_up(queries, options)
        other.warm_up(queries, options)
        for i, query in enumerate(queries):
            for timed in (this, other) if i % 2 == 0 else (other, this):
                timed.search(query, options)
    finally:
        this.close()
        other.close()
    mine = summary(this.latencies, this.stages, this.degraded)
    theirs = summary(other.latencies, other.stages, other.degraded)
    per_query = [a / b for a, b in zip(this.latencies, other.latencies, strict=True)]
    return {
        "this": mine,
        "other": theirs,
        # From the unrounded figures.
        "ratios": {
            f"{name}_ms": round(figure(this.latencies) / figure(other.latencies), 3)
            for name, figure in RAW_FIGURES.items()
        },
        "median_per_query_ratio": round(statistics.median(per_query), 3),
    }


RAW_FIGURES: dict[str, Callable[[list[float]], float]] = {
    "p50": lambda latencies: percentile(latencies, 50),
    "p95": lambda latencies: percentile(latencies, 95),
    "p99": lambda latencies: percentile(latencies, 99),
    "mean": statistics.fmean,
}


def summary(latencies: list[float], stages: dict[str, float], degraded: int) -> dict[str, Any]:
    """A mode's figures from one API's latencies (ms), summed stage timings and degraded
    responses."""
    queries = len(latencies)
    total = sum(stages.values()) or 1.0
    return {
        "queries": queries,
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "mean_ms": round(statistics.fmean(latencies), 1),
        "degraded": degraded,
        # "retrieve" spans the embedding and both arms, which overlap in it.
        "stage_shares": {
            s: round(ms / total, 3)
            for s, ms in sorted(stages.items())
            if s not in ("embed", "dense", "lexical")
        },
        "inside_retrieve_ms_mean": {
            s: round(stages.get(s, 0.0) / queries, 2) for s in ("embed", "dense", "lexical")
        },
    }


def measure_modes(
    args: argparse.Namespace, env: dict[str, str], key: str, all_queries: list[str], size: int
) -> tuple[dict[str, Any], int]:
    """Every mode's latencies through an API process of its own (and, ``--against``, the
    other checkout's beside it); and this build's process's RSS."""
    with ExitStack() as running:
        api = running.enter_context(_running(start_api(args.port, env)))
        other = None
        if args.against:
            other = running.enter_context(_running(start_api(args.port + 1, env, args.against)))
        results = {}
        for i, (mode, options) in enumerate(MODES.items()):
            if mode == "hybrid+rerank" and not args.rerank_model:
                continue
            queries = all_queries[i * args.queries : (i + 1) * args.queries]
            if other is None:
                results[mode] = run_mode(args.port, key, queries, options)
            else:
                ports = (args.port, args.port + 1)
                results[mode] = run_mode_paired(ports, key, queries, options)
            print(f"{size:>7} chunks {mode:<14} {json.dumps(results[mode])}", flush=True)
        api_rss_mb = round(psutil.Process(api.pid).memory_info().rss / 1024 / 1024)
    return results, api_rss_mb


@contextmanager
def _running(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``process``, stopped on the way out (killed if it does not stop within 30 s)."""
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--base", type=int, default=3000, help="real passages to embed")
    parser.add_argument("--queries", type=int, default=200, help="queries per mode")
    parser.add_argument("--port", type=int, default=58123)
    parser.add_argument(
        "--rerank-model",
        default=os.environ.get("CONCORD_RERANK_MODEL", ""),
        help="bi-encoder for the hybrid+rerank mode (see scripts/fetch_mpnet.sh)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout whose API answers the same queries in turn (see above)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/query.json")
    args = parser.parse_args()
    args.against = args.against.resolve() if args.against else None
    args.out.parent.mkdir(parents=True, exist_ok=True)

    all_queries = [
        json.loads(line)["text"]
        for line in (args.dataset / "queries.jsonl").read_text().splitlines()
    ]
    random.Random(7).shuffle(all_queries)
    sizes = [int(s) for s in args.sizes.split(",")]
    texts: list[str] = []
    vectors = np.zeros((0, 0))
    env = {
        "CONCORD_RERANK_KIND": "bi-encoder" if args.rerank_model else "none",
        "CONCORD_RERANK_MODEL": args.rerank_model,
    }
    report: dict[str, Any] = {
        "rerank_model": args.rerank_model or None,
        "against": str(args.against) if args.against else None,
        "sizes": {},
    }
    for size in sizes:
        tenant = f"benchq-{size}"
        existing = chunk_count(tenant)
        if existing not in (0, size):
            print(f"{tenant} holds {existing} chunks, not {size}: rebuilding it", flush=True)
            drop_tenant(tenant)
            existing = 0
        if existing != size:
            if not texts:
                texts = base_passages(args.dataset, args.base)
                print(f"embedding {len(texts)} base passages...", flush=True)
                vectors = get_embedder().embed_passages(texts)
            populate(tenant, size, texts, vectors)
        # What the beat does within a minute: a tenant past the threshold gets a partition and
        # an HNSW graph of its own (shared/stores/partitions.py); timed, as it is part of growth.
        started = time.monotonic()
        placement = place_tenants(unit_of_work, wait_s=600)
        placed_s = round(time.monotonic() - started, 1)
        print(f"{tenant}: placement {placement.as_dict()} in {placed_s} s", flush=True)
        with temporary_key(tenant) as key:  # revoked after the run (a tenant has 100 at most)
            results, api_rss_mb = measure_modes(args, env, key, all_queries, size)
        footprint = {**storage(tenant), "api_rss_mb": api_rss_mb}
        print(f"{size:>7} chunks storage {json.dumps(footprint)}", flush=True)
        report["sizes"][str(size)] = {
            **results,
            "placement": {**placement.as_dict(), "seconds": placed_s},
            "storage": footprint,
        }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
