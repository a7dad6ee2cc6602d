"""Ingest benchmark: a BEIR corpus through the real queue, against the encoder alone.

Publishes every document as an upload event (as `concord ingest` does: a few dozen events per
message; `--one-event-per-message` for a direct producer's path), waits until every job is
indexed and Elasticsearch holds every chunk, and reports end-to-end chunks/s. Then,
in the same run and on the same chunk texts, it times the configured passage encoder alone
(same model and device, every core: one embed_passages() call over all the texts, which the
ONNX encoders take one text at a time and torch in length batches) and prints the ratio, plus
each stage's share of the worker's time. It measures such pairs --repeats times (default 3),
each into a tenant of its own with the cache cleared, and reports the pair with the median
ratio, listing every pair's ratio. Last, it times every passage encoder alone, as one such
call and laid out as the worker runs it (its processes, each single-threaded with a share of
the texts), and prints the ratio against the fastest of those.

    .venv/bin/concord stack up
    .venv/bin/python bench/ingest.py --dataset ../shared/datasets/scifact --limit 1000

The embedding cache is cleared for the model first (pass --keep-cache to skip), or a re-run
would measure cache hits instead of encoding.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cpu_meter import StackCpuMeter  # noqa: E402
from evaluation.corpus import wait_elasticsearch  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.documents.events import EventBatcher, build_upload_event  # noqa: E402
from shared.ingest.embedding import (  # noqa: E402
    Embedder,
    get_embedder,
    torch_threads_per_process,
)
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


ENCODERS = ("torch", "torch-bf16", "onnx", "onnx-int8")


def _embedder(encoder: str) -> Embedder:
    return Embedder(get_settings().model_copy(update={"passage_encoder": encoder}))


def _encode_share(
    share: list[tuple[str, int]], threads: int, encoder: str, ready: Any, go: Any
) -> tuple[float, float]:
    """In a fresh process: the model loaded and torch sized as in a worker process, then
    (once every process is ready) this share encoded; returns its start and end."""
    import torch

    torch.set_num_threads(threads)
    embedder = _embedder(encoder)
    embedder.model()
    embedder.passage_encoder()  # loaded (and exported, quantized) before the clock starts
    ready.release()
    go.wait()
    started = time.monotonic()
    embedder.embed_passages([text for text, _ in share], token_counts=[n for _, n in share])
    return started, time.monotonic()


def encode_in_worker_layout(
    chunks: list[tuple[str, int]], settings: Any, encoder: str
) -> tuple[float, int, int]:
    """The same texts through the encoder alone, laid out as the worker runs it: as many
    processes as it has, each with its share of torch threads and of the texts. Returns the
    wall time from the common start to the last process's end, and the layout."""
    processes = max(1, settings.worker_concurrency)
    threads = torch_threads_per_process(settings, processes)
    context = multiprocessing.get_context("spawn")
    manager = context.Manager()
    ready, go = manager.Semaphore(0), manager.Event()
    with context.Pool(processes) as pool:
        pending = [
            pool.apply_async(_encode_share, (chunks[i::processes], threads, encoder, ready, go))
            for i in range(processes)
        ]
        for _ in range(processes):
            ready.acquire()
        go.set()
        spans = [p.get() for p in pending]
    manager.shutdown()
    return max(end for _, end in spans) - min(start for start, _ in spans), processes, threads


def publish_each(events: list[dict[str, Any]]) -> None:
    for event in events:
        publish_upload_event(event)


def ingest(
    docs: list[dict[str, Any]],
    tenant: str,
    publish: Callable[[list[dict[str, Any]]], None],
    timeout: float,
    label: str = "published",
) -> None:
    """Publish ``docs`` as upload events and wait until every job is indexed and
    Elasticsearch holds every chunk."""
    started = time.monotonic()
    batcher = EventBatcher(publish)
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
            progress(label, i, len(docs), started)
    batcher.flush()
    print()
    wait_indexed(tenant, len(docs), started, timeout)
    wait_elasticsearch(tenant, timeout, interval_s=POLL_S)


def clear_embedding_cache(model_id: str) -> None:
    """So that the next run encodes its texts instead of finding them cached."""
    with unit_of_work() as uow:
        uow.session.execute(delete(EmbeddingCache).where(EmbeddingCache.model == model_id))


def chunks_of(tenant: str) -> list[tuple[str, int]]:
    """Every chunk's text and the token count the chunker recorded, in document order."""
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.text, Chunk.token_count)
            .where(Chunk.tenant_id == tenant)
            .order_by(Chunk.document_id, Chunk.ordinal)
        ).all()
    return [(text, count) for text, count in rows]


def measure_pair(
    docs: list[dict[str, Any]],
    tenant: str,
    publish: Callable[[list[dict[str, Any]]], None],
    args: argparse.Namespace,
    settings: Any,
) -> dict[str, Any]:
    """One end-to-end run into ``tenant`` and, right after it, the configured passage
    encoder alone (one embed_passages() call on every core) on the same texts."""
    embedder = get_embedder()
    if not args.keep_cache:
        clear_embedding_cache(embedder.model_id)
    meter = StackCpuMeter(settings)
    with meter:
        started = time.monotonic()
        ingest(docs, tenant, publish, args.timeout)
        end_to_end_s = time.monotonic() - started
    chunks = chunks_of(tenant)
    embedder.model()  # loaded before timing, as in a worker
    encode_started, encode_cpu_started = time.monotonic(), time.process_time()
    # With the token counts the chunker recorded, as the worker passes them.
    embedder.embed_passages([t for t, _ in chunks], token_counts=[n for _, n in chunks])
    encoder_s = time.monotonic() - encode_started
    return {
        "tenant": tenant,
        "chunks": len(chunks),
        "end_to_end_s": round(end_to_end_s, 2),
        "encoder_only_s": round(encoder_s, 2),
        # chunks/s end to end over chunks/s of the encoder alone, on the same chunks
        "ratio": round(encoder_s / end_to_end_s, 3),
        # What each part of the stack used during the end-to-end run, against what the
        # encoder alone used for the same texts (both in CPU seconds, all threads).
        "stack_cpu_s": meter.core_seconds(),
        "encoder_only_cpu_s": round(time.process_time() - encode_cpu_started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--keep-cache", action="store_true")
    parser.add_argument(
        "--warmup",
        type=int,
        default=300,
        help="documents (from after the measured ones) ingested into a tenant of their own "
        "before the clock starts; 0 to measure a cold stack",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="end-to-end and encoder-alone pairs, each into a tenant of its own with the cache "
        "cleared; the median ratio is reported, as two shared cores make single runs noisy",
    )
    parser.add_argument(
        "--one-event-per-message",
        action="store_true",
        help="publish each event in a message of its own (a direct producer's path) instead "
        "of a few dozen per message, as `concord ingest` does",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/ingest.json")
    args = parser.parse_args()
    if args.repeats < 1 or args.limit < 1 or args.warmup < 0:
        parser.error("--repeats and --limit must be at least 1, --warmup at least 0")

    settings = get_settings()
    corpus = load_corpus(args.dataset, args.limit + args.warmup)
    docs, warmup_docs = corpus[: args.limit], corpus[args.limit :]
    tenant = f"bench-{int(time.time())}"
    publish = publish_each if args.one_event_per_message else publish_upload_events
    if warmup_docs:
        # A freshly started Elasticsearch spends several CPU-seconds compiling its bulk
        # path; other documents of the corpus take that hit before the clock starts.
        ingest(warmup_docs, f"{tenant}-warmup", publish, args.timeout, label="warm-up")

    # Each pair is measured back to back, so a change in the host's load between pairs
    # moves both of its timings; the median pair is the figure.
    runs = []
    for run in range(1, args.repeats + 1):
        print(f"run {run}/{args.repeats}")
        runs.append(measure_pair(docs, f"{tenant}-{run}", publish, args, settings))
        print(json.dumps({k: runs[-1][k] for k in ("end_to_end_s", "encoder_only_s", "ratio")}))
    median = sorted(runs, key=lambda r: r["ratio"])[(len(runs) - 1) // 2]

    # The reference above is what a user of sentence-transformers gets from one encode()
    # call. The fair reference is the fastest way the same model encodes the same texts on
    # this machine: one call or the worker's own layout (several single-threaded processes),
    # through torch or ONNX Runtime, fp32 or int8; all are timed here, side by side.
    texts = chunks_of(median["tenant"])
    layouts: dict[str, float] = {}
    for encoder in ENCODERS:
        embedder = _embedder(encoder)
        embedder.model()
        embedder.passage_encoder()
        started = time.monotonic()
        embedder.embed_passages([t for t, _ in texts], token_counts=[n for _, n in texts])
        layouts[f"one call, {encoder}"] = round(time.monotonic() - started, 2)
        layout_s, processes, threads = encode_in_worker_layout(texts, settings, encoder)
        layouts[f"{processes} processes x {threads} threads, {encoder}"] = round(layout_s, 2)
        print(json.dumps({"encoder alone": layouts}), flush=True)
    fastest = min(layouts, key=layouts.__getitem__)
    in_use = get_embedder().passage_encoding  # what the stack's workers ran
    layout_s = layouts[f"{processes} processes x {threads} threads, {in_use}"]

    chunks = median["chunks"]
    report = {
        "documents": len(docs),
        "warmup_documents": len(warmup_docs),
        "chunks": chunks,
        "events_per_message": 1 if args.one_event_per_message else "up to 32",
        "batch_size": settings.embedding_batch_size,
        "chunk_max_tokens": settings.chunk_max_tokens,
        "repeats": len(runs),
        "ratios": [r["ratio"] for r in runs],
        "end_to_end_s": median["end_to_end_s"],
        "end_to_end_chunks_per_s": round(chunks / median["end_to_end_s"], 2),
        "encoder_only_s": median["encoder_only_s"],
        "encoder_only_chunks_per_s": round(chunks / median["encoder_only_s"], 2),
        "ratio": median["ratio"],
        "passage_encoder": in_use,
        "encoder_worker_layout": f"{processes} processes x {threads} threads",
        "encoder_worker_layout_s": round(layout_s, 2),
        "ratio_to_worker_layout": round(layout_s / median["end_to_end_s"], 3),
        "encoder_alone_s": layouts,
        "fastest_encoder_layout": fastest,
        "fastest_encoder_layout_chunks_per_s": round(chunks / layouts[fastest], 2),
        "ratio_to_fastest_layout": round(layouts[fastest] / median["end_to_end_s"], 3),
        "chunks_per_stack_cpu_s": round(chunks / max(sum(median["stack_cpu_s"].values()), 1e-9), 2),
        "stage_shares": stage_shares(median["tenant"]),
        "stack_cpu_s": median["stack_cpu_s"],
        "stack_cpu_total_s": round(sum(median["stack_cpu_s"].values()), 1),
        "encoder_only_cpu_s": median["encoder_only_cpu_s"],
        "tenant": median["tenant"],
        "runs": runs,
    }
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
