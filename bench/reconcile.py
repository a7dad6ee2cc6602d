"""Reconcile benchmark: time to find and to repair 0 %, 1 % and 100 % loss of one tenant's
Elasticsearch copies.

Fills a tenant with ``--size`` synthetic chunks in both stores (the same generator as
bench/query.py; reused on later runs), then for each loss level deletes that share of the
tenant's Elasticsearch copies, times a dry-run reconcile (finding the drift), then times the
repair (queue, relay, verify) that must end with no drift before the next level.

    .venv/bin/concord stack up --infra-only
    .venv/bin/python bench/reconcile.py --size 100000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from elasticsearch import helpers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from query import base_passages, chunk_count, drop_tenant, populate  # noqa: E402

from shared.db import unit_of_work  # noqa: E402
from shared.ingest.embedding import get_embedder  # noqa: E402
from shared.reconcile.service import reconcile, reconcile_and_verify  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.stores.compose import connect  # noqa: E402
from shared.stores.elastic import get_es  # noqa: E402
from shared.stores.es_index import tenant_alias  # noqa: E402


def chunk_ids(tenant: str) -> list[str]:
    from sqlalchemy import select

    from shared.models import Chunk

    with unit_of_work() as uow:
        return list(uow.session.scalars(select(Chunk.id).where(Chunk.tenant_id == tenant)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--drifts", default="0,0.01,1")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/reconcile.json")
    args = parser.parse_args()

    tenant = f"benchr-{args.size}"
    existing = chunk_count(tenant)
    if existing != args.size:
        if existing:
            drop_tenant(tenant)
        texts = base_passages(args.dataset, 1000)
        populate(tenant, args.size, texts, get_embedder().embed_passages(texts))
    _, after = reconcile_and_verify(connect(), unit_of_work, tenant)  # start from agreement
    assert after.total() == 0, after.as_dict()

    es, alias = get_es(), tenant_alias(get_settings(), tenant)  # the tenant's own index
    ids = chunk_ids(tenant)
    rng = random.Random(1)
    results = []
    for drift in (float(d) for d in args.drifts.split(",")):
        victims = rng.sample(ids, int(len(ids) * drift))
        helpers.bulk(
            es,
            (
                {
                    "_op_type": "delete",
                    "_index": alias,
                    "_id": cid,
                    "version": 1,
                    "version_type": "external_gte",
                }
                for cid in victims
            ),
            raise_on_error=False,
            chunk_size=2000,
        )
        es.indices.refresh(index=alias)
        started = time.monotonic()
        report = reconcile(connect(), unit_of_work, tenant, repair=False)
        elapsed = time.monotonic() - started
        row = {
            "chunks": len(ids),
            "drift": drift,
            "injected": len(victims),
            "found_missing": len(report.drift["missing"]),
            "seconds": round(elapsed, 3),
            "buckets_differing": report.buckets_differing,
            "ids_read": report.ids_read,
        }
        if victims:
            started = time.monotonic()
            _, after = reconcile_and_verify(connect(), unit_of_work, tenant)
            row["repair_seconds"] = round(time.monotonic() - started, 3)
            row["drift_after_repair"] = after.total()
            assert after.total() == 0, after.as_dict()
        print(json.dumps(row), flush=True)
        results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
