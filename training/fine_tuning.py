"""Fine-tuning a cross-encoder on (query, passage, label) pairs, and what a training run is
asked for (its options): the torch side of ``concord reranker train`` (training/reranker.py
mines the pairs and validates the result)."""

from __future__ import annotations

import math
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class TrainingOptions:
    split: str = "train"
    base_model: str | None = None  # default: the packaged embedding model's body
    epochs: int = 3
    learning_rate: float = 1e-4
    batch_size: int = 16
    max_length: int = 256
    warmup_ratio: float = 0.1
    hard_negatives: int = 4
    random_negatives: int = 1
    mining_depth: int = 30  # documents retrieved per query to mine hard negatives from
    profile: str | None = None  # mine with this search profile (the one the reranker serves)
    validation_fraction: float = 0.1
    rerank_window: int = 20
    max_queries: int | None = None
    max_steps: int | None = None  # stop early (the CI run trains a few steps)
    seed: int = 13


@dataclass
class Pair:
    query: str
    passage: str
    label: float


def fine_tune(
    base: str, pairs: list[Pair], options: TrainingOptions, out_dir: Path, progress: Progress
) -> tuple[int, float]:
    """Train the cross-encoder and save it (Hugging Face layout, loadable by CrossEncoder)."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )

    torch.manual_seed(options.seed)
    torch.set_num_threads(threads())
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(
        base,
        num_labels=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
    )
    _identity_pooler(model, torch)
    model.train()

    batches_per_epoch = math.ceil(len(pairs) / options.batch_size)
    total = batches_per_epoch * options.epochs
    if options.max_steps is not None:
        total = min(total, options.max_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.learning_rate, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(  # type: ignore[no-untyped-call]
        optimizer, max(1, int(total * options.warmup_ratio)), total
    )
    positives = sum(1 for p in pairs if p.label > 0)
    # Positives are about one pair in six: weighting them keeps the model from settling on
    # "nothing is relevant", a constant score that ranks nothing.
    loss_fn = torch.nn.BCEWithLogitsLoss(
        pos_weight=torch.tensor((len(pairs) - positives) / max(positives, 1))
    )
    order = list(range(len(pairs)))
    rng = random.Random(options.seed)
    step, recent = 0, list[float]()
    while step < total:
        rng.shuffle(order)
        for start in range(0, len(order), options.batch_size):
            batch = [pairs[i] for i in order[start : start + options.batch_size]]
            features = tokenizer(
                [p.query for p in batch],
                [p.passage for p in batch],
                padding=True,
                truncation="longest_first",
                max_length=options.max_length,
                return_tensors="pt",
            )
            logits = model(**features).logits.view(-1)
            loss = loss_fn(logits, torch.tensor([p.label for p in batch]))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            recent = [*recent[-49:], loss.item()]
            progress("train", step, total)
            if step >= total:
                break
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return step, statistics.fmean(recent)


def _identity_pooler(model: Any, torch: Any) -> None:
    pooler = getattr(model.base_model, "pooler", None)
    if pooler is None or not hasattr(pooler, "dense"):
        return
    with torch.no_grad():
        size = pooler.dense.weight.shape[0]
        pooler.dense.weight.copy_(torch.eye(size))
        pooler.dense.bias.zero_()


def threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))
