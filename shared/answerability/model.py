"""A small, calibrated answerability model: logistic regression on standardized features
(optionally with their pairwise products), fitted by Newton's method with an L2 penalty and
calibrated by Platt scaling on out-of-fold scores.

Small on purpose: the whole model is a few hundred numbers in JSON (stored in Postgres, no
files to ship between hosts), and a prediction is one dot product (microseconds), so the
≤ 2 ms a query budget is spent on nothing. Training picks the variant and penalty on
held-out training queries (:func:`select_model`)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Variant:
    interactions: bool  # add every pairwise product of the standardized features
    l2: float

    @property
    def label(self) -> str:
        return f"logistic{'+pairs' if self.interactions else ''} l2={self.l2:g}"


VARIANTS = tuple(Variant(i, l2) for i in (False, True) for l2 in (0.1, 1.0, 10.0, 100.0))


@dataclass
class AnswerabilityModel:
    feature_names: list[str]
    mean: np.ndarray
    scale: np.ndarray
    interactions: bool
    coef: np.ndarray
    intercept: float
    calibration: tuple[float, float]  # Platt: p = sigmoid(a * logit + b)

    def design(self, features: np.ndarray) -> np.ndarray:
        return _design((np.atleast_2d(features) - self.mean) / self.scale, self.interactions)

    def logits(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self.design(features) @ self.coef + self.intercept)

    def probability(self, features: np.ndarray) -> np.ndarray:
        """The calibrated probability that the index holds an answer, per row."""
        a, b = self.calibration
        return _sigmoid(a * self.logits(features) + b)

    def contributions(self, features: np.ndarray) -> dict[str, float]:
        """Each feature's share of one query's logit (coefficient x standardized value; the
        pairwise terms are split evenly between their two features), to say what drove it."""
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.scale
        n = len(self.feature_names)
        shares = self.coef[:n] * z
        if self.interactions:
            for k, (i, j) in enumerate(combinations(range(n), 2)):
                term = self.coef[n + k] * z[i] * z[j]
                shares[i] += term / 2
                shares[j] += term / 2
        return {
            name: round(float(v), 4) for name, v in zip(self.feature_names, shares, strict=True)
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "logistic",
            "feature_names": self.feature_names,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "interactions": self.interactions,
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            "calibration": list(self.calibration),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AnswerabilityModel:
        a, b = data["calibration"]
        return cls(
            feature_names=list(data["feature_names"]),
            mean=np.asarray(data["mean"], dtype=np.float64),
            scale=np.asarray(data["scale"], dtype=np.float64),
            interactions=bool(data["interactions"]),
            coef=np.asarray(data["coef"], dtype=np.float64),
            intercept=float(data["intercept"]),
            calibration=(float(a), float(b)),
        )


def fit(
    x: np.ndarray, y: np.ndarray, variant: Variant, feature_names: list[str]
) -> AnswerabilityModel:
    """Fit on ``x`` (rows of features) and ``y`` (1 = answerable); uncalibrated (a=1, b=0)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0  # a constant feature stays at zero
    design = _design((x - mean) / scale, variant.interactions)
    coef, intercept = _newton_logistic(design, y, variant.l2)
    return AnswerabilityModel(
        feature_names, mean, scale, variant.interactions, coef, intercept, (1.0, 0.0)
    )


def platt(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Platt scaling: the one-feature logistic regression of the labels on the logits."""
    coef, intercept = _newton_logistic(logits.reshape(-1, 1), y, 1e-6)
    return float(coef[0]), intercept


def folds_by_group(groups: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """Validation masks: every row of one group (a query's two variants) in the same fold,
    so a model is never validated on the other half of a query it trained on."""
    unique = np.unique(groups)
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = {g: i % k for i, g in zip(order, unique, strict=True)}
    assignment = np.asarray([fold_of[g] for g in groups])
    return [assignment == i for i in range(k)]


def out_of_fold_logits(
    x: np.ndarray, y: np.ndarray, folds: list[np.ndarray], variant: Variant, names: list[str]
) -> np.ndarray:
    logits = np.zeros(len(y))
    for held_out in folds:
        model = fit(x[~held_out], y[~held_out], variant, names)
        logits[held_out] = model.logits(x[held_out])
    return logits


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The probability that a random positive scores above a random negative (ties half)."""
    pos, neg = scores[positive == 1], scores[positive == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    # average ranks over ties
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def abstain_threshold(
    probability: np.ndarray, answerable: np.ndarray, max_false_abstain: float
) -> dict[str, float]:
    """The threshold with the highest abstain recall (unanswerable below it) whose false
    abstain rate (answerable below it) stays within ``max_false_abstain``."""
    best = {"threshold": 0.0, "abstain_recall": 0.0, "false_abstain": 0.0}
    pos, neg = probability[answerable == 1], probability[answerable == 0]
    for t in np.unique(np.concatenate([[0.0], probability, [1.0]])):
        false_abstain = float(np.mean(pos < t))
        recall = float(np.mean(neg < t))
        if false_abstain <= max_false_abstain and recall > best["abstain_recall"]:
            best = {
                "threshold": round(float(t), 6),
                "abstain_recall": round(recall, 4),
                "false_abstain": round(false_abstain, 4),
            }
    return best


def _design(z: np.ndarray, interactions: bool) -> np.ndarray:
    if not interactions:
        return z
    pairs = [z[:, i] * z[:, j] for i, j in combinations(range(z.shape[1]), 2)]
    return np.column_stack([z, *pairs])


def _newton_logistic(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """L2-penalized logistic regression (the intercept unpenalized) by Newton's method: a
    few dozen iterations on a few thousand rows, exact to the tolerance."""
    design = np.column_stack([np.ones(len(x)), x])
    w = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(100):
        p = _sigmoid(design @ w)
        gradient = design.T @ (p - y) + penalty * w
        hessian = (design.T * (p * (1 - p))) @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w[1:], float(w[0])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -500, 500))))
