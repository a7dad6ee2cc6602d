"""``concord reranker train``: fine-tune a cross-encoder on a tenant's own relevance judgements.

1. Pairs. For each judged query of the split (never one that the test split also judges), the
   relevant documents are positives; hard negatives are the first unjudged documents Concord's
   own hybrid search returns for it (the retrieval the reranker will sit behind), plus random
   passages so the model also sees easy negatives. Passages are what the rerank stage reads at
   search time (:func:`rerank_passage`: title and chunk text).
2. Model. A BERT-style body (default: the packaged all-MiniLM-L6-v2 the embedder uses) with a
   one-logit classification head. Two changes make such a bi-encoder body train well as a
   cross-encoder: the pooler's dense layer starts as the identity (the body was never trained
   through a pooler, a random one hides what the body knows) and dropout is off.
3. Training: binary cross-entropy weighted towards the rarer positives, AdamW with linear
   warm-up and decay. A held-out part of the split's queries measures nDCG@10 of the hybrid
   window before and after reranking, through the same loading code the search service uses.
   The blend of reranker and fused scores that does best on those queries is recorded and
   used by searches with this model (a reranker trained on a few hundred queries does best
   next to the fused ranking, not instead of it).
4. The model directory gets a model card (``card.json`` and ``README.md``) and is registered
   under a name for the dataset's tenant.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evaluation import beir
from evaluation.corpus import sync_corpus
from evaluation.harness import eval_tenant
from evaluation.metrics import ndcg_at_k, unique
from shared.db import unit_of_work
from shared.rerankers import service as rerankers
from shared.rerankers.scoring import CrossEncoderReranker, rerank_passage
from shared.search.rerank import blend_scores
from shared.search.schemas import SearchRequest
from shared.search.service import search
from shared.settings import get_settings
from shared.stores.compose import connect
from training import repository as repo
from training.fine_tuning import Pair, Progress, TrainingOptions, fine_tune, threads


class TrainingRefused(ValueError):
    pass


@dataclass
class Validation:
    """Held-out queries with their hybrid window: (external id, passage, fused score) in
    fused order."""

    windows: dict[str, list[tuple[str, str, float]]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


BLENDS = tuple(round(0.1 * i, 1) for i in range(11))


def refuse_test_split(split: str) -> None:
    if split == "test":
        raise TrainingRefused("refusing to train on the test split: it is what eval reports")


def train_reranker(
    dataset_dir: Path, name: str, options: TrainingOptions, progress: Progress
) -> dict[str, Any]:
    """Mine pairs, train, validate, save with a model card, register. Returns the card."""
    refuse_test_split(options.split)
    started = time.monotonic()
    settings = get_settings()
    dataset = beir.load(dataset_dir)
    qrels = dataset.qrels(options.split)
    queries, excluded = dataset.queries_outside_test(options.split)
    queries = queries[: options.max_queries]
    if len(queries) < 2:
        raise TrainingRefused(
            f"need at least 2 judged {options.split} queries outside the test split "
            f"(found {len(queries)})"
        )
    tenant = eval_tenant(dataset)
    sync_corpus(tenant, dataset.corpus, progress, 3600)

    rng = random.Random(options.seed)
    validation_queries, training_queries = _split(queries, options, rng)

    pairs, validation = mine_pairs(
        tenant, training_queries, validation_queries, qrels, options, rng, progress
    )
    base = options.base_model or settings.embedding_model_path()
    out_dir = (
        settings.state_path()
        / "rerankers"
        / tenant
        / (f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}")
    )
    training_started = time.monotonic()
    steps, final_loss = fine_tune(base, pairs, options, out_dir, progress)
    training_s = time.monotonic() - training_started

    validated = validate(out_dir, validation, qrels, options, progress)
    positives = sum(1 for p in pairs if p.label > 0)
    card: dict[str, Any] = {
        "name": name,
        "tenant": tenant,
        "base_model": base,
        "data": {
            "dataset": dataset.name,
            "split": options.split,
            "queries_used_for_training": len(training_queries),
            "queries_held_out_for_validation": len(validation_queries),
            "queries_excluded_because_judged_in_test": excluded,
            "pairs": len(pairs),
            "positive_pairs": positives,
            "negative_pairs": len(pairs) - positives,
            "hard_negatives_from": f"hybrid search, first {options.mining_depth} documents"
            + (f", profile {options.profile}" if options.profile else ""),
        },
        "hyperparameters": {
            k: v
            for k, v in asdict(options).items()
            if k not in ("split", "base_model", "profile", "max_queries")
        },
        "training": {
            "steps": steps,
            "final_loss": round(final_loss, 4),
            "training_seconds": round(training_s, 1),
            "total_seconds": round(time.monotonic() - started, 1),
            "threads": threads(),
        },
        "validation": validated,
        "trained_at": datetime.now(UTC).isoformat(),
    }
    write_model_card(out_dir, card)
    with unit_of_work() as uow:
        previous = rerankers.find(uow.session, tenant, name)
        old_path = previous.path if previous else None
        rerankers.register(uow.session, tenant, name, out_dir, base, card)
    if old_path and old_path != str(out_dir):
        rerankers.remove_files(old_path)
    return card


def _split(
    queries: list[tuple[str, str]], options: TrainingOptions, rng: random.Random
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(validation, training) queries: a seeded shuffle, so a re-validation finds the same."""
    shuffled = queries[:]
    rng.shuffle(shuffled)
    n_validation = max(1, round(len(shuffled) * options.validation_fraction))
    return shuffled[:n_validation], shuffled[n_validation:]


# What decides which queries were held out and how they are mined and ranked: re-validation
# uses the values the model was trained with, whatever the caller passes now.
HELD_OUT_SETTINGS = ("seed", "validation_fraction", "rerank_window", "mining_depth", "max_length")


def revalidate_reranker(
    dataset_dir: Path, name: str, options: TrainingOptions, progress: Progress
) -> dict[str, Any]:
    """Validate a registered reranker again on its held-out queries (after the corpus or the
    search settings changed) and record the new figures and blend in its card."""
    dataset = beir.load(dataset_dir)
    tenant = eval_tenant(dataset)
    with unit_of_work() as uow:
        entry = rerankers.get(uow.session, tenant, name)
        card, path = dict(entry.card), entry.path
    recorded = card["hyperparameters"]
    trained = replace(options, **{k: recorded[k] for k in HELD_OUT_SETTINGS if k in recorded})
    qrels = dataset.qrels(trained.split)
    queries = dataset.queries_outside_test(trained.split)[0]
    used = (
        card["data"]["queries_used_for_training"] + card["data"]["queries_held_out_for_validation"]
    )
    queries = queries[:used]
    rng = random.Random(trained.seed)
    validation_queries, _ = _split(queries, trained, rng)
    _, validation = mine_pairs(tenant, [], validation_queries, qrels, trained, rng, progress)
    card["validation"] = validate(Path(path), validation, qrels, trained, progress)
    card["revalidated_at"] = datetime.now(UTC).isoformat()
    write_model_card(Path(path), card)
    with unit_of_work() as uow:
        rerankers.get(uow.session, tenant, name).card = card
    return card


def mine_pairs(
    tenant: str,
    training_queries: list[tuple[str, str]],
    validation_queries: list[tuple[str, str]],
    qrels: beir.Qrels,
    options: TrainingOptions,
    rng: random.Random,
    progress: Progress,
) -> tuple[list[Pair], Validation]:
    """Positives from the judgements, hard negatives from Concord's own hybrid search."""
    all_queries = training_queries + validation_queries
    held_out = {qid for qid, _ in validation_queries}
    positives_needed = {
        doc for qid, _ in training_queries for doc, rel in qrels[qid].items() if rel > 0
    }
    first_passage = _first_passages(tenant, positives_needed)
    random_pool = _random_passages(
        tenant, max(1, options.random_negatives * len(training_queries)), rng
    )

    pairs: list[Pair] = []
    validation = Validation()
    stores = connect()
    for i, (qid, text) in enumerate(all_queries, start=1):
        request = SearchRequest.model_validate(
            {
                "query": text,
                "top_k": max(options.mining_depth, options.rerank_window),
                "mode": "hybrid",
                "per_document_cap": 1,
                "candidate_depth": {"dense": 100, "lexical": 100},
                **({"profile": options.profile} if options.profile else {}),
            }
        )
        results = search(stores, unit_of_work, tenant, request).results
        retrieved = [
            (r.external_id or "", rerank_passage(r.title, r.text), r.score) for r in results
        ]
        if qid in held_out:
            validation.windows[qid] = retrieved[: options.rerank_window]
            validation.texts[qid] = text
        else:
            judged = qrels[qid]
            passage_of = {doc: passage for doc, passage, _ in retrieved}
            for doc, rel in judged.items():
                passage = passage_of.get(doc) or first_passage.get(doc)
                if rel > 0 and passage:
                    pairs.append(Pair(text, passage, 1.0))
            hard = [p for doc, p, _ in retrieved if doc not in judged][: options.hard_negatives]
            pairs += [Pair(text, p, 0.0) for p in hard]
            for _ in range(options.random_negatives):
                doc, passage = rng.choice(random_pool)
                if doc not in judged:
                    pairs.append(Pair(text, passage, 0.0))
        progress("mine hard negatives", i, len(all_queries))
    if training_queries and not any(p.label > 0 for p in pairs):
        raise TrainingRefused("no positive pairs: are the judged documents in the corpus?")
    rng.shuffle(pairs)
    return pairs, validation


def validate(
    model_dir: Path,
    validation: Validation,
    qrels: beir.Qrels,
    options: TrainingOptions,
    progress: Progress,
) -> dict[str, Any]:
    """nDCG@10 of the held-out queries' hybrid windows as fused, as reranked by the saved
    model (loaded the way the search service loads it), and blended with the fused scores at
    the blend that does best here; the blend is what searches with this model use."""
    settings = get_settings()
    reranker = CrossEncoderReranker(
        str(model_dir), options.max_length, options.batch_size, settings.embedding_device
    )
    scored: list[tuple[str, list[str], list[float], list[float]]] = []
    pairs, seconds = 0, 0.0
    for i, (qid, window) in enumerate(validation.windows.items(), start=1):
        started = time.perf_counter()
        scores = reranker.score(validation.texts[qid], [p for _, p, _ in window]) if window else []
        seconds += time.perf_counter() - started
        pairs += len(window)
        scored.append((qid, [d for d, _, _ in window], [f for _, _, f in window], scores))
        progress("validate", i, len(validation.windows))

    def mean_ndcg(blend: float) -> float:
        values = []
        for qid, docs, fused, scores in scored:
            ranking = blend_scores(scores, fused, blend)
            order = [docs[i] for i in sorted(range(len(docs)), key=lambda i: -ranking[i])]
            values.append(ndcg_at_k(unique(order), qrels[qid], 10))
        return statistics.fmean(values)

    by_blend = {blend: mean_ndcg(blend) for blend in BLENDS}
    best = max(BLENDS, key=lambda b: (by_blend[b], b))
    return {
        "queries": len(scored),
        "window": options.rerank_window,
        "ndcg@10_hybrid": round(by_blend[0.0], 4),
        "ndcg@10_reranked": round(by_blend[1.0], 4),
        "blend": best,
        "ndcg@10_blended": round(by_blend[best], 4),
        "ndcg@10_by_blend": {str(b): round(v, 4) for b, v in by_blend.items()},
        "pairs_per_second": round(pairs / max(seconds, 1e-9), 1),
    }


def write_model_card(out_dir: Path, card: dict[str, Any]) -> None:
    (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    v, d, t, h = card["validation"], card["data"], card["training"], card["hyperparameters"]
    lines = [
        f"# Reranker `{card['name']}` (tenant `{card['tenant']}`)",
        "",
        "A cross-encoder fine-tuned by `concord reranker train` on this tenant's own "
        "judgements. It is for this corpus: a reranker trained on one corpus's judgements can "
        "rank another corpus worse than no reranker at all.",
        "",
        f"- Base model: `{card['base_model']}`",
        f"- Data: `{d['dataset']}` split `{d['split']}`: {d['queries_used_for_training']} "
        f"training queries, {d['queries_held_out_for_validation']} held out, "
        f"{d['queries_excluded_because_judged_in_test']} left out because the test split "
        f"judges them",
        f"- Pairs: {d['pairs']} ({d['positive_pairs']} positive, {d['negative_pairs']} "
        f"negative; hard negatives from {d['hard_negatives_from']})",
        f"- Hyper-parameters: {json.dumps(h)}",
        f"- Training: {t['steps']} steps in {t['training_seconds']} s on {t['threads']} "
        f"threads (final loss {t['final_loss']})",
        f"- Validation ({v['queries']} held-out queries, window {v['window']}): nDCG@10 "
        f"{v['ndcg@10_hybrid']} as fused, {v['ndcg@10_reranked']} reranked alone, "
        f"{v['ndcg@10_blended']} blended at {v['blend']} (what searches use); "
        f"{v['pairs_per_second']} pairs/s",
        f"- Trained at {card['trained_at']}",
        "",
    ]
    (out_dir / "README.md").write_text("\n".join(lines))


def _first_passages(tenant: str, external_ids: set[str]) -> dict[str, str]:
    """Each document's first chunk, for positives the search did not retrieve."""
    if not external_ids:
        return {}
    with unit_of_work() as uow:
        rows = repo.first_chunks(uow.session, tenant, external_ids)
    first: dict[str, str] = {}
    for external_id, title, text in rows:
        first.setdefault(external_id, rerank_passage(title, text))
    return first


def _random_passages(tenant: str, n: int, rng: random.Random) -> list[tuple[str, str]]:
    with unit_of_work() as uow:
        rows = repo.random_chunks(uow.session, tenant, n, rng.random() * 2 - 1)
    return [(external_id, rerank_passage(title, text)) for external_id, title, text in rows]
