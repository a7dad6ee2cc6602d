"""How far any answerability decision can get on the eval's unanswerable variant: an oracle.

``concord eval`` withholds the relevant documents of a random half of the test queries; a
query is unanswerable when none of its relevant documents is left. This benchmark runs each
test query through the service's own arms (the search's default request) on the dataset's
tenant, removes the withheld documents, fuses the arms again, and then lets a *perfect*
judge read the first ``k`` documents: it says "answerable" exactly when one of them is
relevant (ties below it broken by the best dense cosine). Whatever a real judge reads, it
cannot know more than that judge of the same ``k`` documents; so the figures printed for
each ``k`` (ROC AUC and the best abstain recall within 5 % false abstains, as the eval
reports them) are an upper bound for a decision that reads the first ``k`` results.

    .venv/bin/concord stack up            # the dataset's tenant, synced by concord eval
    .venv/bin/python bench/answerability_ceiling.py --dataset ../shared/datasets/scifact

The same lines give the score-shape features' own place on that scale: the dense cosine's
row (k = 0) is the judge that reads nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evaluation import beir  # noqa: E402
from evaluation.abstain import AbstainRun, roc, withhold_half  # noqa: E402
from evaluation.harness import eval_tenant  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.search.fusion import fuse  # noqa: E402
from shared.search.retrieve import dense_arm, lexical_arm, query_vector  # noqa: E402
from shared.search.schemas import SearchRequest  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.stores.compose import connect  # noqa: E402
from shared.stores.schemas import ArmHit, document_of_chunk  # noqa: E402
from training.repository import external_ids_by_document  # noqa: E402

DEPTHS = (0, 1, 3, 5, 10, 20, 50)


def ranked_without(
    request: SearchRequest, tenant: str, withheld: frozenset[str], external_of: dict[str, str]
) -> tuple[list[str], float | None]:
    """The query's documents in fused order as an index without ``withheld`` would rank
    them (both arms twice as deep as the request, cut back to its depth after removing),
    and the best dense cosine among them."""
    settings = get_settings()
    deeper = request.model_copy(
        update={
            "candidate_depth": request.candidate_depth.model_copy(
                update={
                    "dense": 2 * request.candidate_depth.dense,
                    "lexical": 2 * request.candidate_depth.lexical,
                }
            )
        }
    )
    vector = query_vector(request.query, settings)
    with unit_of_work() as uow:
        dense = dense_arm(connect().vectors(uow.session), tenant, vector, request=deeper)
    arms = {"dense": dense, "lexical": lexical_arm(connect().index, tenant, deeper)}
    kept: dict[str, list[ArmHit]] = {}
    for arm, hits in arms.items():
        left = [h for h in hits if external_of.get(document_of_chunk(h.chunk_id)) not in withheld]
        depth = getattr(request.candidate_depth, arm)
        kept[arm] = [ArmHit(h.chunk_id, rank, h.score) for rank, h in enumerate(left[:depth], 1)]
    documents = [
        external_of.get(document_of_chunk(cid), "") for cid, _ in fuse(kept, request.fusion)
    ]
    best_cosine = max((h.score for h in kept["dense"]), default=None)
    return list(dict.fromkeys(documents)), best_cosine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--seed", type=int, default=13, help="as concord eval's --seed")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/answerability_ceiling.json"
    )
    args = parser.parse_args()

    dataset = beir.load(args.dataset)
    qrels = dataset.qrels(args.split)
    queries = dataset.split_queries(args.split)
    withholding = withhold_half(queries, qrels, args.seed)
    tenant = eval_tenant(dataset)
    with unit_of_work() as uow:
        external_of = external_ids_by_document(uow.session, tenant)
    if not external_of:
        print(f"tenant {tenant} holds no documents: run concord eval (or tune) first")
        return 2

    ranked: dict[str, tuple[list[str], float | None]] = {}
    for qid, text in queries:
        ranked[qid] = ranked_without(
            SearchRequest(query=text), tenant, withholding.withheld_docs, external_of
        )
    rows: list[dict[str, Any]] = []
    for k in DEPTHS:
        run = AbstainRun()
        for qid, (documents, cosine) in ranked.items():
            found = any(qrels[qid].get(d, 0) > 0 for d in documents[:k])
            # A perfect judge of the first k documents; the cosine orders what it cannot tell.
            tie = 0.0 if cosine is None else (cosine + 1) / 4  # within [0, 0.5]
            run.decisions[qid] = {"status": "answerable", "top_score": float(found) + tie}
        figures = roc(run, withholding)
        best = figures["best_within_5pct_false_abstain"]
        rows.append(
            {
                "judge_reads_first_documents": k,
                "auc": figures["auc"],
                "abstain_recall_within_5pct_false_abstain": best["abstain_recall"],
                "false_abstain": best["false_abstain"],
            }
        )
        label = "the dense cosine alone" if k == 0 else f"a perfect judge of the first {k}"
        print(
            f"{label:34s} ROC AUC {figures['auc']:.3f}  abstain recall at <= 5 % false "
            f"abstains {best['abstain_recall']:.3f}"
        )
    result = {
        "dataset": dataset.name,
        "split": args.split,
        "seed": args.seed,
        "unanswerable": len(withholding.unanswerable),
        "answerable": len(withholding.answerable),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
