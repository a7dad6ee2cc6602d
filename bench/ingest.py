"""Ingest benchmark: a BEIR corpus through the real queue, against the encoder alone.

Publishes every document as an upload event (as `concord ingest` does: a few dozen events per
message; `--one-event-per-message` for a direct producer's path), waits until every job is
indexed and Elasticsearch holds every chunk, and reports end-to-end chunks/s. Then,
in the same run and on the same chunk texts, it times the sentence-transformers encoder alone
(same model, batch size and device) and prints the ratio, plus each stage's share of the
worker's time.

    .venv/bin/concord stack up
    .venv/bin/python bench/ingest.py --dataset ../shared/datasets/scifact --limit 1000

The embedding cache is cleared for the model first (pass --keep-cache to skip), or a re-run
would measure cache hits instead of encoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cpu_meter import StackCpuMeter  # noqa: E402
from services.evaluation.corpus import wait_elasticsearch  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.ingest.embedding import get_embedder  # noqa: E402
from shared.ingest.upload_event import EventBatcher, build_upload_event  # noqa: E402
from shared.models import Chunk, EmbeddingCache, IngestJob  # noqa: E402
from shared.queue import publish_upload_event, publish_upload_events  # noqa: E402
from shared.settings import get_settings  # noqa: E402


def load_corpus(dataset: Path, limit: int) -> list[dict[str, Any]]:
    docs = []
    with (dataset / "corpus.jsonl").open() as f:
        for line in f:
            docs.append(json.loads(line))
            if len(docs) == limit:
                break
    return docs


def progress(label: str, done: int, total: int, started: float) -> None:
    rate = done / max(time.monotonic() - started, 1e-9)
    print(f"\r{label}: {done}/{total} ({rate:.1f}/s)", end="", flush=True)


# How often the end is checked: finer would load the stack it measures, coarser would add
# up to this much to the end-to-end time.
POLL_S = 0.1


def wait_indexed(tenant: str, total: int, started: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with unit_of_work() as uow:
            states = dict(
                uow.session.execute(
                    select(IngestJob.state, func.count())
                    .where(IngestJob.tenant_id == tenant)
                    .group_by(IngestJob.state)
                ).all()
            )
        finished = sum(states.get(s, 0) for s in ("indexed", "failed", "dead_lettered"))
        progress("indexed", finished, total, started)
        if finished >= total:
            print()
            if states.get("indexed", 0) != total:
                raise SystemExit(f"not every job was indexed: {states}")
            return
        time.sleep(POLL_S)
    raise SystemExit(f"timed out; job states: {states}")


def stage_shares(tenant: str) -> dict[str, float]:
    with unit_of_work() as uow:
        timings = uow.session.scalars(
            select(IngestJob.stage_timings).where(IngestJob.tenant_id == tenant)
        ).all()
    totals: dict[str, float] = {}
    for timing in timings:
        for stage, seconds in timing.items():
            totals[stage] = totals.get(stage, 0.0) + float(seconds)
    whole = sum(totals.values()) or 1.0
    return {stage: round(seconds / whole, 4) for stage, seconds in sorted(totals.items())}


def publish_each(events: list[dict[str, Any]]) -> None:
    for event in events:
        publish_upload_event(event)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--keep-cache", action="store_true")
    parser.add_argument(
        "--one-event-per-message",
        action="store_true",
        help="publish each event in a message of its own (a direct producer's path) instead "
        "of a few dozen per message, as `concord ingest` does",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/ingest.json")
    args = parser.parse_args()

    settings = get_settings()
    embedder = get_embedder()
    docs = load_corpus(args.dataset, args.limit)
    tenant = f"bench-{int(time.time())}"
    if not args.keep_cache:
        with unit_of_work() as uow:
            uow.session.execute(
                delete(EmbeddingCache).where(EmbeddingCache.model == embedder.model_id)
            )

    meter = StackCpuMeter(settings)
    with meter:
        started = time.monotonic()
        batcher = EventBatcher(
            publish_each if args.one_event_per_message else publish_upload_events
        )
        for i, doc in enumerate(docs, start=1):
            batcher.add(
                build_upload_event(
                    tenant_id=tenant,
                    external_id=doc["_id"],
                    raw=doc["text"].encode(),
                    content_type="text/plain",
                    title=doc.get("title", ""),
                )
            )
            if i % 100 == 0 or i == len(docs):
                progress("published", i, len(docs), started)
        batcher.flush()
        print()
        wait_indexed(tenant, len(docs), started, args.timeout)
        with unit_of_work() as uow:
            chunks = uow.session.execute(
                select(Chunk.text, Chunk.token_count)
                .where(Chunk.tenant_id == tenant)
                .order_by(Chunk.document_id, Chunk.ordinal)
            ).all()
        texts = [text for text, _ in chunks]
        wait_elasticsearch(tenant, args.timeout, interval_s=POLL_S)
        end_to_end_s = time.monotonic() - started

    embedder.model()  # loaded before timing, as in a worker
    encode_started, encode_cpu_started = time.monotonic(), time.process_time()
    # With the token counts the chunker recorded, as the worker passes them.
    embedder.embed_passages(texts, token_counts=[count for _, count in chunks])
    encoder_s = time.monotonic() - encode_started
    encoder_cpu_s = time.process_time() - encode_cpu_started
    stack_cpu = meter.core_seconds()

    e2e_rate = len(texts) / end_to_end_s
    encoder_rate = len(texts) / encoder_s
    report = {
        "documents": len(docs),
        "chunks": len(texts),
        "events_per_message": 1 if args.one_event_per_message else "up to 32",
        "batch_size": settings.embedding_batch_size,
        "chunk_max_tokens": settings.chunk_max_tokens,
        "end_to_end_s": round(end_to_end_s, 2),
        "end_to_end_chunks_per_s": round(e2e_rate, 2),
        "encoder_only_s": round(encoder_s, 2),
        "encoder_only_chunks_per_s": round(encoder_rate, 2),
        "ratio": round(e2e_rate / encoder_rate, 3),
        "stage_shares": stage_shares(tenant),
        # What each part of the stack used during the end-to-end run, against what the
        # encoder alone used for the same texts (both in CPU seconds, all threads).
        "stack_cpu_s": stack_cpu,
        "stack_cpu_total_s": round(sum(stack_cpu.values()), 1),
        "encoder_only_cpu_s": round(encoder_cpu_s, 1),
        "tenant": tenant,
    }
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
