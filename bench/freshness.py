"""Freshness: how long after its job is indexed a document is found by the lexical search.

Publishes ``--documents`` upload events (SciFact documents), one every ``--interval-s``, into a
tenant of its own, as a steady trickle of uploads does, while a reader searches that tenant
every ``POLL_S`` (so its shard refreshes on Elasticsearch's own schedule, once a second, as it
does for a tenant someone is searching). For each document it records when Postgres marked
its job indexed and when Elasticsearch first returned its chunks, and prints the lag's
p50, p95 and maximum. No refresh is forced: the lag is the relay's and the refresh's.

    .venv/bin/concord stack up
    .venv/bin/python bench/freshness.py --documents 40 --interval-s 0.4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

from elasticsearch import ApiError
from sqlalchemy import select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import load_corpus  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.documents.events import build_upload_event  # noqa: E402
from shared.models import Document, IngestJob  # noqa: E402
from shared.queue import publish_upload_events  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.stores.elastic import get_es  # noqa: E402
from shared.stores.es_index import tenant_alias  # noqa: E402

POLL_S = 0.02


def indexed_at(tenant: str) -> dict[str, datetime]:
    """When each of the tenant's documents' jobs finished as indexed, by external id."""
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Document.external_id, IngestJob.finished_at)
            .join(IngestJob, IngestJob.document_id == Document.id)
            .where(IngestJob.tenant_id == tenant, IngestJob.state == "indexed")
        ).all()
    return {external_id: finished for external_id, finished in rows if finished is not None}


def found(tenant: str, wanted: int) -> set[str]:
    """The external ids the tenant's index returns to a search now (no refresh forced)."""
    try:
        answer = get_es().search(
            index=tenant_alias(get_settings(), tenant),
            size=0,
            query={"term": {"tenant_id": tenant}},
            aggs={"ids": {"terms": {"field": "external_id", "size": wanted}}},
        )
    except ApiError as e:
        # 404: no index yet (the first upload's copies are not sent); 503: its shard is not
        # started yet
        if e.meta.status in (404, 503):
            return set()
        raise
    return {bucket["key"] for bucket in answer["aggregations"]["ids"]["buckets"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--interval-s", type=float, default=0.4)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/freshness.json")
    args = parser.parse_args()
    if args.documents < 1 or args.interval_s < 0:
        parser.error("--documents must be at least 1 and --interval-s at least 0")

    docs = load_corpus(args.dataset, args.documents)
    tenant = f"fresh-{int(time.time())}"
    seen_at: dict[str, float] = {}  # external id -> wall clock when a search first found it
    next_publish, published = time.monotonic(), 0
    deadline = time.monotonic() + args.timeout
    while len(seen_at) < len(docs):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {len(seen_at)} of {len(docs)} documents found")
        if published < len(docs) and time.monotonic() >= next_publish:
            doc = docs[published]
            event = build_upload_event(
                tenant_id=tenant,
                external_id=doc["_id"],
                raw=doc["text"].encode(),
                content_type="text/plain",
                title=doc.get("title", ""),
            )
            publish_upload_events([event])
            published += 1
            next_publish += args.interval_s
        now = time.time()
        for external_id in found(tenant, len(docs)) - seen_at.keys():
            seen_at[external_id] = now
        time.sleep(POLL_S)

    finished = indexed_at(tenant)
    lags = sorted(seen_at[e] - finished[e].timestamp() for e in seen_at)
    report = {
        "tenant": tenant,
        "documents": len(docs),
        "interval_s": args.interval_s,
        "lag_from_indexed_to_found_s": {
            "p50": round(statistics.median(lags), 3),
            "p95": round(lags[min(len(lags) - 1, int(0.95 * len(lags)))], 3),
            "max": round(lags[-1], 3),
            "min": round(lags[0], 3),
        },
        "settings": {
            "relay_interval_seconds": get_settings().relay_interval_seconds,
        },
    }
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
