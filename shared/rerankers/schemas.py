"""Response bodies of the trained-reranker registry."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.schemas import Timestamp


class RerankerView(BaseModel):
    name: str
    base_model: str
    created_at: Timestamp
    card: dict[str, Any] = Field(
        description="the model card: data, pair counts, hyper-parameters, validation nDCG@10"
    )
