"""Response bodies of the answerability-model registry, and the trace a search shows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.schemas import Timestamp


class AnswerabilityModelView(BaseModel):
    name: str
    created_at: Timestamp
    thresholds: dict[str, float] = Field(
        description="abstain below `abstain`, verify below `answer`, answer from `answer`"
    )
    card: dict[str, Any] = Field(
        description="the model card: data, model class chosen on validation, validation "
        "curve and AUC, what each feature weighs"
    )


class AnswerabilityTrace(BaseModel):
    """Why the decision is what it is: the calibrated probability that the index holds an
    answer, the thresholds it was compared with, and the features with their share of it."""

    model: str
    probability: float
    abstain_below: float
    verify_below: float
    features: dict[str, float]
    contributions: dict[str, float] = Field(
        description="each feature's share of the logit, largest magnitude first"
    )
