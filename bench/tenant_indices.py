"""What an index per tenant costs: creating a tenant's index, the memory an idle tenant holds,
and lexical search latency, at 1, 100 and 1,000 tenants (``--counts``), next to the same
tenants in one shared index (the layout before, whose BM25 statistics mixed tenants).

Writes synthetic tenants of ``--docs`` chunks each straight into Elasticsearch, through the
chunk index adapter, under index prefixes of its own (``<prefix>-bench...``, removed at the
end), so it needs only Elasticsearch up (``concord stack up --infra-only``):

    .venv/bin/python bench/tenant_indices.py --counts 1,100,1000

Memory is read from Elasticsearch's own node stats (the heap's old generation, its lowest
reading over eight seconds) and the process's resident set; both move with garbage
collection, so the per-tenant figure is the slope across the counts, not one reading.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.cli.stack import ElasticsearchService  # noqa: E402
from shared.models import Chunk, Document  # noqa: E402
from shared.settings import Settings, get_settings  # noqa: E402
from shared.stores.buckets import bucket_of  # noqa: E402
from shared.stores.chunk_index import ElasticsearchChunkIndex  # noqa: E402
from shared.stores.elastic import get_es  # noqa: E402
from shared.stores.es_index import ensure_index, index_body  # noqa: E402

WORDS = [
    "basalt",
    "granite",
    "schist",
    "gneiss",
    "quartz",
    "feldspar",
    "mica",
    "olivine",
    "pyroxene",
    "garnet",
    "calcite",
    "dolomite",
    "gypsum",
    "halite",
    "magnetite",
    "hematite",
    "pyrite",
    "galena",
    "sphalerite",
    "cinnabar",
    "fluorite",
    "apatite",
    "topaz",
    "corundum",
    "diamond",
    "graphite",
    "sulfur",
    "talc",
    "kaolinite",
    "serpentine",
    "chlorite",
    "epidote",
    "zircon",
    "rutile",
]


def chunks_of(tenant: str, docs: int, rng: random.Random) -> list[tuple[Chunk, Document]]:
    made = []
    for d in range(docs):
        document_id = uuid.uuid4()
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
        chunk = Chunk(
            id=f"{document_id}:0",
            tenant_id=tenant,
            document_id=document_id,
            version=1,
            ordinal=0,
            text=text,
            text_hash=f"{d:064d}",
            char_start=0,
            char_end=len(text),
            section="",
            title="",
            token_count=len(text.split()),
            bucket=bucket_of(f"{document_id}:0"),
            fingerprint=0,
            metadata_={},
        )
        made.append((chunk, Document(id=document_id, tenant_id=tenant, external_id=f"d{d}")))
    return made


def heap_and_rss(es: Any, settings: Settings) -> tuple[float, float]:
    """(MiB of the heap's old generation in use, resident MiB). What outlives a young
    collection sits in the old generation; its lowest reading over a few seconds is close to
    what the indices hold, not garbage waiting to be collected."""
    readings = []
    for _ in range(16):
        stats = next(iter(es.nodes.stats(metric="jvm")["nodes"].values()))
        readings.append(stats["jvm"]["mem"]["pools"]["old"]["used_in_bytes"] / 2**20)
        time.sleep(0.5)
    heap = min(readings)
    pid = ElasticsearchService(settings).pid()
    rss = psutil.Process(pid).memory_info().rss / 2**20 if pid else float("nan")
    return heap, rss


def search_latency(index: ElasticsearchChunkIndex, tenants: list[str], n: int) -> dict[str, float]:
    rng = random.Random(7)
    samples = []
    for _ in range(n):
        tenant = rng.choice(tenants)
        query = " ".join(rng.sample(WORDS, 3))
        started = time.perf_counter()
        index.lexical_search(tenant, query, None, 10)
        samples.append((time.perf_counter() - started) * 1e3)
    quantiles = statistics.quantiles(samples, n=20)
    return {"p50_ms": round(statistics.median(samples), 2), "p95_ms": round(quantiles[-1], 2)}


def shared_layout(settings: Settings) -> ElasticsearchChunkIndex:
    """The layout before: one index for every tenant, the read alias its write index."""
    es, alias = get_es(), settings.es_chunks_alias()
    es.indices.create(index=f"{alias}-v1", **index_body(settings))
    es.indices.put_alias(index=f"{alias}-v1", name=alias, is_write_index=True)
    return ElasticsearchChunkIndex(es, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,100,1000")
    parser.add_argument("--docs", type=int, default=20, help="chunks per tenant")
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/tenant_indices.json")
    args = parser.parse_args()
    counts = sorted(int(c) for c in args.counts.split(","))
    base = get_settings()
    run = uuid.uuid4().hex[:6]
    own = base.model_copy(update={"es_index_prefix": f"{base.es_index_prefix}-bench{run}t"})
    one = base.model_copy(update={"es_index_prefix": f"{base.es_index_prefix}-bench{run}s"})
    es = get_es()
    ensure_index(own, es)
    per_tenant, shared = ElasticsearchChunkIndex(es, own), shared_layout(one)
    rng = random.Random(1)
    rows: list[dict[str, Any]] = []
    tenants: list[str] = []
    heap0, rss0 = heap_and_rss(es, base)
    try:
        for count in counts:
            created_ms: list[float] = []
            while len(tenants) < count:
                tenant = f"bt{len(tenants):05d}"
                chunks = chunks_of(tenant, args.docs, rng)
                started = time.perf_counter()
                failed = per_tenant.prepare([tenant])
                created_ms.append((time.perf_counter() - started) * 1e3)
                assert not failed, failed
                assert set(per_tenant.write(chunks, "external")) == {201}
                assert set(shared.write(chunks, "external")) == {201}
                tenants.append(tenant)
            es.indices.refresh(index=own.es_chunks_alias())
            es.indices.refresh(index=one.es_chunks_alias())
            heap, rss = heap_and_rss(es, base)
            state_bytes = len(json.dumps(es.cluster.state(metric="metadata").body))
            row = {
                "tenants": count,
                "index_creation_ms": {
                    "mean": round(statistics.fmean(created_ms), 1) if created_ms else None,
                    "p95": round(statistics.quantiles(created_ms, n=20)[-1], 1)
                    if len(created_ms) >= 20
                    else (round(max(created_ms), 1) if created_ms else None),
                },
                "old_gen_heap_mib": round(heap, 1),
                "old_gen_heap_growth_mib": round(heap - heap0, 1),
                "rss_mib": round(rss, 1),
                "rss_growth_mib": round(rss - rss0, 1),
                "cluster_metadata_kib": round(state_bytes / 1024, 1),
                "search_own_index": search_latency(per_tenant, tenants, args.searches),
                "search_shared_index": search_latency(shared, tenants, args.searches),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for settings in (own, one):
            es.indices.delete(index=f"{settings.es_chunks_alias()}-*", allow_no_indices=True)
            if es.indices.exists_index_template(name=settings.es_chunks_alias()):
                es.indices.delete_index_template(name=settings.es_chunks_alias())
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        span = last["tenants"] - first["tenants"]
        slope = {
            "old_gen_heap_kib_per_tenant": round(
                (last["old_gen_heap_mib"] - first["old_gen_heap_mib"]) * 1024 / span, 1
            ),
            "rss_kib_per_tenant": round((last["rss_mib"] - first["rss_mib"]) * 1024 / span, 1),
            "metadata_kib_per_tenant": round(
                (last["cluster_metadata_kib"] - first["cluster_metadata_kib"]) / span, 2
            ),
        }
        print(json.dumps({"per_idle_tenant": slope}))
        rows.append({"per_idle_tenant": slope})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
