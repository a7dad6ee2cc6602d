"""``concord answerability train``: learn when the index cannot answer, from the operator's
own judgements (a train split; the test split is refused).

Labels come from the simulation ``concord tune`` uses: each judged query runs once through the
service's own dense and BM25 arms (the search's default request), and gives two examples: the
arms as they are (the index holds an answer: answerable) and the same arms with every chunk
of the query's relevant documents removed (the index without its answer: unanswerable).
Features are the ones a search computes (shared/answerability/features.py). The model class
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
    answerability_features,
    per_document,
)
from shared.db import unit_of_work
from shared.search.schemas import SearchRequest
from shared.search.service import dense_arm, lexical_arm, query_vector
from shared.settings import get_settings
from shared.stores.schemas import document_of_chunk
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
    with unit_of_work() as uow:
        external_of = repo.external_ids_by_document(uow.session, tenant)

    x, y, groups = _examples(tenant, queries, qrels, external_of, progress)
    folds = learn.folds_by_group(groups, FOLDS, options.seed)
    names = list(FEATURE_NAMES)
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
    }
    card = {
        "dataset": dataset.name,
        "split": options.split,
        "tenant": tenant,
        "queries": len(queries),
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


def _examples(
    tenant: str,
    queries: list[tuple[str, str]],
    qrels: beir.Qrels,
    external_of: dict[str, str],
    progress: Progress,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    settings = get_settings()
    rows, labels, groups = [], [], []
    document_of = document_of_chunk
    for i, (qid, text) in enumerate(queries, start=1):
        request = SearchRequest(query=text)  # the arms as a default search runs them
        vector = query_vector(text, settings)
        dense = dense_arm(unit_of_work, tenant, vector, request, settings)
        lexical = lexical_arm(tenant, request, settings)
        relevant = {d for d, r in qrels[qid].items() if r > 0}

        unanswered = (
            [h for h in dense if external_of.get(document_of(h.chunk_id)) not in relevant],
            [h for h in lexical if external_of.get(document_of(h.chunk_id)) not in relevant],
        )
        for label, d, lex in ((1, dense, lexical), (0, *unanswered)):
            rows.append(
                answerability_features(
                    text, per_document(d, document_of), per_document(lex, document_of)
                )
            )
            labels.append(label)
            groups.append(i)
        progress("retrieve (train queries)", i, len(queries))
    return np.asarray(rows), np.asarray(labels, dtype=np.float64), np.asarray(groups)


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
