"""What the answerability decision costs a search: the features from both arms' hits (per
document, 50 deep) plus the calibrated model, timed per query in this process. Uses a
registered model when ``--tenant`` (and ``--name``) are given (Postgres up), else one fitted
here on synthetic features with pairwise terms, the largest variant training considers:

    .venv/bin/python bench/answerability.py --tenant eval-scifact
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.answerability import model as learn  # noqa: E402
from shared.answerability import service as registry  # noqa: E402
from shared.answerability.features import FEATURE_NAMES  # noqa: E402
from shared.stores.schemas import ArmHit, document_of_chunk  # noqa: E402


def synthetic_model() -> registry.LoadedModel:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1600, len(FEATURE_NAMES)))
    y = (x[:, 0] + rng.normal(size=1600) > 0).astype(np.float64)
    fitted = learn.fit(x, y, learn.Variant(True, 10.0), list(FEATURE_NAMES))
    return registry.LoadedModel("synthetic", fitted, 0.3, 0.5)


def registered_model(tenant: str, name: str) -> registry.LoadedModel:
    from shared.db import unit_of_work

    with unit_of_work() as uow:
        return registry.load(registry.get(uow.session, tenant, name))


def arms(rng: random.Random, depth: int) -> tuple[list[ArmHit], list[ArmHit]]:
    """Two arms of ``depth`` chunk hits over about depth/2 documents each, half shared."""
    docs = [f"{rng.getrandbits(64):016x}" for _ in range(depth)]

    def arm(scale: float, pool: list[str]) -> list[ArmHit]:
        hits = [
            (f"{rng.choice(pool)}:{rng.randrange(4)}", rng.random() * scale) for _ in range(depth)
        ]
        hits.sort(key=lambda h: -h[1])
        return [ArmHit(cid, rank, score) for rank, (cid, score) in enumerate(hits, start=1)]

    return arm(1.0, docs[: depth // 2 + depth // 4]), arm(30.0, docs[depth // 4 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenant", help="judge with this tenant's registered model")
    parser.add_argument("--name", default=registry.DEFAULT_MODEL)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=50, help="hits per arm (the default depth)")
    args = parser.parse_args()
    loaded = registered_model(args.tenant, args.name) if args.tenant else synthetic_model()
    rng = random.Random(7)
    inputs = [arms(rng, args.depth) for _ in range(args.queries)]
    query = "does the loss of a tumour suppressor gene drive tumour growth in mice"
    for dense, lexical in inputs[:50]:  # warm-up
        loaded.judge(query, dense, lexical, document_of_chunk)
    times = []
    for dense, lexical in inputs:
        started = time.perf_counter()
        loaded.judge(query, dense, lexical, document_of_chunk)
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    result = {
        "model": loaded.name,
        "pairwise_terms": loaded.model.interactions,
        "hits_per_arm": args.depth,
        "queries": args.queries,
        "ms_per_query": {
            "p50": round(statistics.median(times), 4),
            "p95": round(times[int(0.95 * len(times)) - 1], 4),
            "p99": round(times[int(0.99 * len(times)) - 1], 4),
            "mean": round(statistics.fmean(times), 4),
        },
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "answerability.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
