"""``concord answerability train``: learn when the index cannot answer, from the operator's
own judgements (a train split; the test split is refused).

Labels come from the simulation ``concord tune`` uses: each judged query runs once through the
service's own dense and BM25 arms (the search's default request), and gives two examples: the
arms as they are (the index holds an answer: answerable) and the same arms with every chunk
of the query's relevant documents removed (the index without its answer: unanswerable).
Features are the ones a search computes (shared/answerability/features.py); with
``--reranker NAME`` also that trained reranker's scores of the first results. A reranker has
learned its own training queries' documents, so its scores of them would be better than any
it gives a new query: the model then trains only on the judged queries the reranker never saw
(those after the ones its training used). The model class
and penalty are chosen on held-out training queries (5 folds, a query's two examples in the
same fold), calibrated by Platt scaling on the out-of-fold scores, and the abstain threshold
is the one with the highest abstain recall at <= 5 % false abstains on those scores."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluation import beir
from evaluation.corpus import sync_corpus
from evaluation.harness import eval_tenant
from evaluation.runner import Progress
from shared.answerability import model as learn
from shared.answerability import service as registry
from shared.answerability.features import (
    FEATURE_DEPTH,
    FEATURE_NAMES,
    RERANK_FEATURE_NAMES,
    RERANK_WINDOW,
    answerability_features,
    per_document,
    rerank_features,
)
from shared.db import unit_of_work
from shared.rerankers import service as rerankers
from shared.rerankers.scoring import Reranker, get_trained_reranker, rerank_passage
from shared.search.fusion import fuse
from shared.search.retrieve import dense_arm, lexical_arm, query_vector
from shared.search.schemas import SearchRequest
from shared.search.service import search
from shared.settings import get_settings
from shared.stores.compose import Stores, connect
from shared.stores.schemas import ArmHit, document_of_chunk
from training import repository as repo
from training.reranker import TrainingRefused, refuse_test_split

FOLDS = 5
# Above this probability the model answers; between the abstain threshold and this, the
# decision is "verify". Even odds on training data balanced by construction (one answerable
# and one unanswerable example per query).
ANSWER_PROBABILITY = 0.5


@dataclass(frozen=True)
class AnswerabilityOptions:
    split: str = "train"
    max_queries: int | None = None
    max_false_abstain: float = 0.05
    seed: int = 13
    reranker: str | None = None  # a trained reranker of the dataset's tenant whose scores it reads


def train_answerability(
    dataset_dir: Path, name: str, options: AnswerabilityOptions, progress: Progress
) -> dict[str, Any]:
    refuse_test_split(options.split)
    dataset = beir.load(dataset_dir)
    qrels = dataset.qrels(options.split)
    queries = dataset.queries_outside_test(options.split)[0][: options.max_queries]
    if len(queries) < FOLDS:
        raise TrainingRefused(f"{len(queries)} judged {options.split} queries: need {FOLDS}+")
    tenant = eval_tenant(dataset)
    sync_corpus(tenant, dataset.corpus, progress, 3600)
    reranker: Reranker | None = None
    reranker_files: str | None = None
    seen_by_reranker = 0
    with unit_of_work() as uow:
        external_of = repo.external_ids_by_document(uow.session, tenant)
        if options.reranker is not None:
            entry = rerankers.get(uow.session, tenant, options.reranker)
            reranker, reranker_files = get_trained_reranker(entry.path), entry.path
            seen_by_reranker = _queries_seen(entry.card, options.split)
    if seen_by_reranker:
        queries = dataset.queries_outside_test(options.split)[0][seen_by_reranker:]
        queries = queries[: options.max_queries]
        if len(queries) < FOLDS:
            raise TrainingRefused(
                f"reranker {options.reranker!r} was trained on the first {seen_by_reranker} "
                f"judged {options.split} queries, which leaves {len(queries)} it never saw; "
                f"need {FOLDS}+: train it with --max-queries to leave some"
            )

    x, y, groups = _examples(connect(), tenant, queries, qrels, external_of, reranker, progress)
    folds = learn.folds_by_group(groups, FOLDS, options.seed)
    names = list(FEATURE_NAMES) + (list(RERANK_FEATURE_NAMES) if reranker else [])
    candidates = []
    for i, variant in enumerate(learn.VARIANTS, start=1):
        logits = learn.out_of_fold_logits(x, y, folds, variant, names)
        candidates.append((learn.roc_auc(logits, y), variant, logits))
        progress("model selection", i, len(learn.VARIANTS))
    auc, chosen, oof_logits = max(candidates, key=lambda c: c[0])
    calibration = learn.platt(oof_logits, y)
    final = learn.fit(x, y, chosen, names)
    final.calibration = calibration
    a, b = calibration
    oof_probability = 1.0 / (1.0 + np.exp(-(a * oof_logits + b)))
    abstain = learn.abstain_threshold(oof_probability, y, options.max_false_abstain)
    answer = max(ANSWER_PROBABILITY, abstain["threshold"])
    verify_share = float(
        np.mean((oof_probability >= abstain["threshold"]) & (oof_probability < answer))
    )
    model_json = {
        "model": final.to_json(),
        "thresholds": {"abstain": abstain["threshold"], "answer": answer},
        "feature_depth": FEATURE_DEPTH,
        "reranker": options.reranker,
        # The training run of that reranker (each writes a directory of its own): a reranker
        # retrained under the same name gives other scores, which this model never saw.
        "reranker_files": reranker_files,
    }
    card = {
        "dataset": dataset.name,
        "split": options.split,
        "tenant": tenant,
        "queries": len(queries),
        "reranker": options.reranker,
        "queries_skipped_as_seen_by_the_reranker": seen_by_reranker,
        "examples": {"answerable": int(y.sum()), "unanswerable": int(len(y) - y.sum())},
        "labels": "each query with its arms as retrieved (answerable) and with its relevant "
        "documents removed (unanswerable)",
        "features": names,
        "model_selection": [
            {
                "model": v.label,
                "validation_auc": round(score, 4),
                "abstain_recall_at_max_false_abstain": learn.abstain_threshold(
                    logits, y, options.max_false_abstain
                )["abstain_recall"],
            }
            for score, v, logits in candidates
        ],
        "chosen": chosen.label,
        "validation": {
            "folds": FOLDS,
            "auc": round(auc, 4),
            "max_false_abstain": options.max_false_abstain,
            **abstain,
            "answer_threshold": answer,
            "verify_share": round(verify_share, 4),
            "curve": _curve(oof_probability, y),
        },
        "calibration": {"platt_a": round(a, 4), "platt_b": round(b, 4)},
        "linear_weights": dict(
            sorted(
                ((n, round(float(w), 4)) for n, w in zip(names, final.coef, strict=False)),
                key=lambda kv: -abs(kv[1]),
            )
        ),
        "inference_us_per_query": _inference_us(final, x),
    }
    with unit_of_work() as uow:
        registry.register(uow.session, tenant, name, model_json, card)
    return {"name": name, **card}


def _queries_seen(card: dict[str, Any], split: str) -> int:
    """How many of the split's judged queries (in the order training reads them) the
    reranker with this card trained or validated on: the first ones."""
    data = card["data"]
    if data["split"] != split:
        return 0
    return int(data["queries_used_for_training"]) + int(data["queries_held_out_for_validation"])


def _examples(
    stores: Stores,
    tenant: str,
    queries: list[tuple[str, str]],
    qrels: beir.Qrels,
    external_of: dict[str, str],
    reranker: Reranker | None,
    progress: Progress,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    settings = get_settings()
    rows, labels, groups = [], [], []
    document_of = document_of_chunk
    for i, (qid, text) in enumerate(queries, start=1):
        request = SearchRequest(query=text)  # the arms as a default search runs them
        vector = query_vector(text, settings)
        with unit_of_work() as uow:
            dense = dense_arm(stores.vectors(uow.session), tenant, vector, request=request)
        lexical = lexical_arm(stores.index, tenant, request)
        relevant = {d for d, r in qrels[qid].items() if r > 0}

        unanswered = (
            _without(dense, relevant, external_of),
            _without(lexical, relevant, external_of),
        )
        first: tuple[list[str], list[str]] = ([], [])
        if reranker is not None:
            first = _first_results(stores, tenant, request, unanswered)
        for label, d, lex, results in (
            (1, dense, lexical, first[0]),
            (0, *unanswered, first[1]),
        ):
            row = answerability_features(
                text, per_document(d, document_of), per_document(lex, document_of)
            )
            if reranker is not None:
                scores = reranker.score(text, results) if results else []
                row = np.concatenate([row, rerank_features(scores)])
            rows.append(row)
            labels.append(label)
            groups.append(i)
        progress("retrieve (train queries)", i, len(queries))
    return np.asarray(rows), np.asarray(labels, dtype=np.float64), np.asarray(groups)


def _without(hits: list[ArmHit], relevant: set[str], external_of: dict[str, str]) -> list[ArmHit]:
    """The arm's hits without the chunks of the ``relevant`` documents (external ids)."""
    return [h for h in hits if external_of.get(document_of_chunk(h.chunk_id)) not in relevant]


def _first_results(
    stores: Stores,
    tenant: str,
    request: SearchRequest,
    unanswered: tuple[list[ArmHit], list[ArmHit]],
) -> tuple[list[str], list[str]]:
    """The reranker passages of the first RERANK_WINDOW live results in fused order (what a
    search's judgement reads): as the search serves them, and as the index without the
    query's relevant documents would (both arms without them, fused again)."""
    served = search(stores, unit_of_work, tenant, request.model_copy(update={"top_k": 100})).results
    passage_of = {r.chunk_id: rerank_passage(r.title, r.text) for r in served}
    without = fuse({"dense": unanswered[0], "lexical": unanswered[1]}, request.fusion)
    return (
        [passage_of[r.chunk_id] for r in served[:RERANK_WINDOW]],
        [passage_of[cid] for cid, _ in without if cid in passage_of][:RERANK_WINDOW],
    )


def _curve(probability: np.ndarray, answerable: np.ndarray) -> list[dict[str, float]]:
    """Abstain recall against false abstains, threshold by threshold (21 points)."""
    pos, neg = probability[answerable == 1], probability[answerable == 0]
    return [
        {
            "threshold": round(float(t), 4),
            "abstain_recall": round(float(np.mean(neg < t)), 4),
            "false_abstain": round(float(np.mean(pos < t)), 4),
        }
        for t in np.quantile(probability, np.linspace(0, 1, 21))
    ]


def _inference_us(model: learn.AnswerabilityModel, x: np.ndarray) -> float:
    rows = x[: min(len(x), 200)]
    started = time.perf_counter()
    for row in rows:
        model.probability(row)
    return round((time.perf_counter() - started) / len(rows) * 1e6, 1)
