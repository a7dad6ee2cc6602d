"""``concord tune``: choose search settings on the user's own judgements (a train split).

Each judged query runs once through the real retrieval arms (the service's own dense and BM25
functions, at the deepest candidate depth tried, once per field-boost setting); every fusion
setting is then scored offline with the service's own fusion code, so hundreds of settings cost
one pass over the stores. The evidence threshold is chosen on a simulation of the unanswerable
case: for each query, the best dense cosine among the first results once its relevant documents
are removed (the index without the answer) against the best with them (the index with it).
The test split is refused: tuning on it would make the evaluation meaningless."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from evaluation import beir
from evaluation import repository as repo
from evaluation.corpus import sync_corpus
from evaluation.harness import eval_tenant
from evaluation.metrics import ndcg_at_k, unique
from evaluation.runner import Progress
from shared.db import unit_of_work
from shared.search.fusion import fuse
from shared.search.profiles import save_profile
from shared.search.retrieve import dense_arm, lexical_arm, query_vector
from shared.search.schemas import CandidateDepth, Fusion, LexicalOptions, SearchRequest
from shared.settings import get_settings
from shared.stores.compose import connect
from shared.stores.schemas import ArmHit

DEPTHS = (20, 50, 100, 200)
TITLE_BOOSTS = (0.5, 1.0, 2.0)
TIE_BREAKERS = (0.0, 0.3, 0.5, 1.0)
LEXICAL_VARIANTS = tuple(itertools.product(TITLE_BOOSTS, TIE_BREAKERS))  # (title boost, tie)
RRF_K = (5, 10, 20, 40, 60, 100)
DENSE_WEIGHTS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
NORMALIZATIONS: tuple[Literal["minmax", "zscore"], ...] = ("minmax", "zscore")
ALPHAS = tuple(round(0.1 * i, 1) for i in range(1, 10))
POLICY_TOP_K = 10  # the default top_k: the policy judges the first ten results
MAX_FALSE_ABSTAIN = 0.05


class TuningRefused(ValueError):
    pass


@dataclass
class QueryArms:
    qid: str
    vector: np.ndarray
    dense: list[ArmHit]
    lexical: dict[tuple[float, float], list[ArmHit]]  # (title boost, tie breaker) -> hits


def fusion_grid() -> list[Fusion]:
    grid = [
        Fusion(method="rrf", k=k, weights={"dense": w, "lexical": 1.0})
        for k, w in itertools.product(RRF_K, DENSE_WEIGHTS)
    ]
    grid += [
        Fusion(method="convex", alpha=a, normalization=n)
        for n, a in itertools.product(NORMALIZATIONS, ALPHAS)
    ]
    return grid


def tune(
    dataset_dir: Path, split: str, name: str, progress: Progress, max_queries: int | None = None
) -> dict[str, Any]:
    if split == "test":
        raise TuningRefused("refusing to tune on the test split: it is what eval reports")
    settings = get_settings()
    dataset = beir.load(dataset_dir)
    qrels = dataset.qrels(split)
    queries = dataset.queries_outside_test(split)[0][:max_queries]
    if not queries:
        raise TuningRefused(f"no judged {split} queries outside the test split")
    tenant = eval_tenant(dataset)
    sync_corpus(tenant, dataset.corpus, progress, 3600)

    with unit_of_work() as uow:
        rows = repo.chunk_embeddings(uow.session, tenant)
    doc_of = {cid: ext for cid, ext, _ in rows}
    row_of = {cid: i for i, (cid, _, _) in enumerate(rows)}
    embeddings = np.asarray([e for _, _, e in rows], dtype=np.float32)

    arms = _collect_arms(tenant, queries, settings, progress)

    def ranking(
        qa: QueryArms, boost: tuple[float, float], depth: int, fusion: Fusion | None
    ) -> list[str]:
        lexical = qa.lexical[boost][:depth]
        fused = fuse({"dense": qa.dense[:depth], "lexical": lexical}, fusion) if fusion else [
            (h.chunk_id, h.score) for h in lexical]  # fmt: skip
        return [cid for cid, _ in fused]

    def mean_ndcg(boost: tuple[float, float], depth: int, fusion: Fusion | None) -> float:
        return statistics.fmean(
            ndcg_at_k(_docs(ranking(qa, boost, depth, fusion), doc_of), qrels[qa.qid], 10)
            for qa in arms
        )

    # 1. BM25 title boost and tie breaker, judged on the lexical arm alone.
    lexical_scores = {b: mean_ndcg(b, max(DEPTHS), None) for b in LEXICAL_VARIANTS}
    boost = max(lexical_scores, key=lambda b: lexical_scores[b])
    # 2. Fusion method, weights / alpha, RRF k and per-arm depth, on the hybrid ranking.
    grid = list(itertools.product(DEPTHS, fusion_grid()))
    scored = []
    for i, (depth, fusion) in enumerate(grid, start=1):
        scored.append((mean_ndcg(boost, depth, fusion), depth, fusion))
        if i % 20 == 0 or i == len(grid):
            progress("fusion grid", i, len(grid))
    scored.sort(key=lambda s: -s[0])
    best_score, best_depth, best_fusion = scored[0]
    defaults = (settings.lexical_field_boosts["title"], settings.lexical_tie_breaker)
    default_score = (
        mean_ndcg(defaults, 50, Fusion()) if defaults in lexical_scores else float("nan")
    )
    # 3. The evidence threshold, on the tuned hybrid ranking.
    threshold = _choose_threshold(
        arms,
        qrels,
        lambda qa: ranking(qa, boost, best_depth, best_fusion),
        doc_of,
        row_of,
        embeddings,
    )

    boosts = {**settings.lexical_field_boosts, "title": boost[0]}
    profile_settings = {
        "mode": "hybrid",
        "fusion": best_fusion.model_dump(mode="json"),
        "candidate_depth": {"dense": best_depth, "lexical": best_depth},
        "lexical": {"field_boosts": boosts, "tie_breaker": boost[1]},
        "policy": {"score_type": "dense_cosine", "min_score": threshold["threshold"]},
    }
    description = (
        f"concord tune on {dataset.name} {split} ({len(arms)} queries): nDCG@10 "
        f"{best_score:.4f} vs {default_score:.4f} with the defaults"
    )
    with unit_of_work() as uow:
        save_profile(uow.session, tenant, name, profile_settings, description)
    return {
        "profile": name,
        "tenant": tenant,
        "split": split,
        "queries": len(arms),
        "skipped_in_test_split": len(dataset.split_queries(split)) - len(arms)
        if max_queries is None
        else None,
        "settings": profile_settings,
        "train_ndcg@10": {"tuned": round(best_score, 4), "defaults": round(default_score, 4)},
        "lexical_ndcg@10": {
            f"title {b[0]}, tie breaker {b[1]}": round(s, 4) for b, s in lexical_scores.items()
        },
        "top_settings": [
            {"ndcg@10": round(s, 4), "depth": d, "fusion": f.model_dump(mode="json")}
            for s, d, f in scored[:5]
        ],
        "threshold": threshold,
    }


def _collect_arms(
    tenant: str, queries: list[tuple[str, str]], settings: Any, progress: Progress
) -> list[QueryArms]:
    depth = max(DEPTHS)
    collected = []
    stores = connect(settings)
    for i, (qid, text) in enumerate(queries, start=1):
        vector = query_vector(text, settings)
        request = SearchRequest(
            query=text, candidate_depth=CandidateDepth(dense=depth, lexical=depth)
        )
        lexical = {}
        for title, tie in LEXICAL_VARIANTS:
            options = LexicalOptions(
                field_boosts={**settings.lexical_field_boosts, "title": title}, tie_breaker=tie
            )
            variant = request.model_copy(update={"lexical": options})
            lexical[(title, tie)] = lexical_arm(stores.index, tenant, variant)
        with unit_of_work() as uow:
            dense = dense_arm(stores.vectors(uow.session), tenant, vector, request=request)
        collected.append(QueryArms(qid, np.asarray(vector, np.float32), dense, lexical))
        progress("retrieve (train queries)", i, len(queries))
    return collected


def _docs(chunk_ids: list[str], doc_of: dict[str, str]) -> list[str]:
    return unique(doc_of[c] for c in chunk_ids if c in doc_of)


def first_chunk_per_document(chunk_ids: list[str], doc_of: dict[str, str]) -> dict[str, str]:
    """Document -> its best-ranked chunk, documents in rank order (one chunk per document, as
    the evaluation asks the service for)."""
    first: dict[str, str] = {}
    for c in chunk_ids:
        if c in doc_of:
            first.setdefault(doc_of[c], c)
    return first


def _choose_threshold(
    arms: list[QueryArms],
    qrels: beir.Qrels,
    rank: Any,
    doc_of: dict[str, str],
    row_of: dict[str, int],
    embeddings: np.ndarray,
) -> dict[str, Any]:
    """Highest abstain recall with at most 5 % false abstain, on the simulated variant."""
    with_answer, without_answer = [], []
    for qa in arms:
        relevant = {d for d, r in qrels[qa.qid].items() if r > 0}
        first_chunk = first_chunk_per_document(rank(qa), doc_of)
        present = list(first_chunk.values())[:POLICY_TOP_K]
        absent = [c for d, c in first_chunk.items() if d not in relevant][:POLICY_TOP_K]
        with_answer.append(_top_cosine(present, qa.vector, row_of, embeddings))
        without_answer.append(_top_cosine(absent, qa.vector, row_of, embeddings))
    best = {"threshold": 0.0, "abstain_recall": 0.0, "false_abstain": 0.0}
    for t in (i / 100 for i in range(101)):
        false_abstain = sum(s < t for s in with_answer) / len(with_answer)
        recall = sum(s < t for s in without_answer) / len(without_answer)
        if false_abstain <= MAX_FALSE_ABSTAIN and recall > best["abstain_recall"]:
            best = {
                "threshold": t,
                "abstain_recall": round(recall, 4),
                "false_abstain": round(false_abstain, 4),
            }
    return {**best, "method": "simulated on the train split (relevant documents removed)"}


def _top_cosine(
    chunk_ids: list[str], vector: np.ndarray, row_of: dict[str, int], embeddings: np.ndarray
) -> float:
    if not chunk_ids:
        return -1.0
    return float(np.max(embeddings[[row_of[c] for c in chunk_ids]] @ vector))
