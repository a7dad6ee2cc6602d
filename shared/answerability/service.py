"""The registry of answerability models (``concord answerability train`` writes it;
``policy.score_type: "answerability"`` in a search request or profile reads it), and the
prediction a search asks of one. Every lookup is scoped to the caller's tenant."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from shared.answerability.features import (
    answerability_features,
    per_document,
    rerank_features,
)
from shared.answerability.model import AnswerabilityModel
from shared.answerability.schemas import AnswerabilityModelView, AnswerabilityTrace
from shared.db.repository import now
from shared.models import TrainedAnswerability
from shared.stores.schemas import ArmHit
from shared.tenants.named import NamedRegistry

DEFAULT_MODEL = "default"


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: AnswerabilityModel
    abstain_below: float
    verify_below: float
    # The tenant's reranker whose scores of the first results the model reads (None: it reads
    # the arms' scores only), and the files of the training run it was trained with.
    reranker: str | None = None
    reranker_files: str | None = None

    def judge(
        self,
        query: str,
        dense: list[ArmHit],
        lexical: list[ArmHit],
        document_of: Callable[[str], str],
        abstain_below: float | None = None,
        verify_below: float | None = None,
        rerank_scores: Sequence[float] | None = None,
    ) -> AnswerabilityTrace:
        """``rerank_scores``: the reranker's scores of the first results in fused order
        (required when the model has a reranker)."""
        features = answerability_features(
            query, per_document(dense, document_of), per_document(lexical, document_of)
        )
        if self.reranker is not None:
            if rerank_scores is None:
                raise ValueError(f"model {self.name!r} reads reranker {self.reranker!r} scores")
            features = np.concatenate([features, rerank_features(rerank_scores)])
        contributions = self.model.contributions(features)
        abstain = self.abstain_below if abstain_below is None else abstain_below
        return AnswerabilityTrace(
            model=self.name,
            probability=round(float(self.model.probability(features)[0]), 6),
            abstain_below=abstain,
            verify_below=max(abstain, self.verify_below if verify_below is None else verify_below),
            features={
                n: round(float(v), 4)
                for n, v in zip(self.model.feature_names, features, strict=True)
            },
            contributions=dict(sorted(contributions.items(), key=lambda kv: -abs(kv[1]))),
        )


# A tenant's trained answerability models, by name (``concord answerability train`` writes
# them; ``policy.answerability_model`` in a search request or profile selects one).
MODELS = NamedRegistry(TrainedAnswerability, "answerability model")


def register(
    session: Session, tenant_id: str, name: str, model: dict[str, Any], card: dict[str, Any]
) -> TrainedAnswerability:
    entry = MODELS.for_writing(session, tenant_id, name)
    entry.model = model
    entry.card = card
    entry.created_at = now(session)
    session.flush()
    return entry


get, list_for_tenant, delete = MODELS.get, MODELS.list, MODELS.delete


# Parsed models by (tenant, name, training run): a search re-reads the row (so a retrained
# model is used at once) but parses its JSON only once.
_parsed: dict[tuple[str, str, datetime], LoadedModel] = {}
_PARSED_MAX = 64


def load(entry: TrainedAnswerability) -> LoadedModel:
    key = (entry.tenant_id, entry.name, entry.created_at)
    loaded = _parsed.get(key)
    if loaded is None:
        thresholds = entry.model["thresholds"]
        loaded = LoadedModel(
            entry.name,
            AnswerabilityModel.from_json(entry.model["model"]),
            float(thresholds["abstain"]),
            float(thresholds["answer"]),
            entry.model.get("reranker"),
            entry.model.get("reranker_files"),
        )
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[key] = loaded
    return loaded


def model_view(entry: TrainedAnswerability) -> AnswerabilityModelView:
    return AnswerabilityModelView(
        name=entry.name,
        created_at=entry.created_at,
        thresholds=entry.model["thresholds"],
        card=entry.card,
    )
