"""The search request: every option validated up front, so bad input is a 422 that says what
is wrong, never a store error. Unknown fields are rejected, not ignored."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Mode = Literal["dense", "lexical", "hybrid"]
Scalar = str | int | float | bool
METADATA_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ][0-9:.]+(Z|[+-]\d{2}:?\d{2})?)?$")
MAX_FILTERS = 20
MAX_IN_VALUES = 100
PROFILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
LEXICAL_FIELDS = ("title", "section", "text")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Range(Strict):
    gt: float | str | None = None
    gte: float | str | None = None
    lt: float | str | None = None
    lte: float | str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Range:
        bounds = [v for v in (self.gt, self.gte, self.lt, self.lte) if v is not None]
        if not bounds:
            raise ValueError("a range needs at least one of gt, gte, lt, lte")
        numbers = all(isinstance(v, int | float) for v in bounds)
        dates = all(isinstance(v, str) and ISO_DATE.match(v) for v in bounds)
        if not (numbers or dates):
            raise ValueError("range bounds must be all numbers or all ISO-8601 dates")
        return self

    @property
    def is_date(self) -> bool:
        return any(isinstance(v, str) for v in (self.gt, self.gte, self.lt, self.lte))

    def bounds(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


MetadataCondition = (
    Scalar | Annotated[list[Scalar], Field(min_length=1, max_length=MAX_IN_VALUES)] | Range
)


class Filters(Strict):
    metadata: dict[str, MetadataCondition] = Field(default_factory=dict)
    document_ids: list[uuid.UUID] | None = Field(default=None, min_length=1, max_length=1000)

    @field_validator("metadata")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_FILTERS:
            raise ValueError(f"at most {MAX_FILTERS} metadata filters")
        for key in value:
            if not METADATA_KEY.match(key):
                raise ValueError(f"invalid metadata field name {key!r}")
        return value

    def is_empty(self) -> bool:
        return not self.metadata and not self.document_ids


class Fusion(Strict):
    method: Literal["rrf", "convex"] = "rrf"
    k: int = Field(default=60, ge=1, le=1000)
    weights: dict[str, float] = Field(default_factory=lambda: {"dense": 1.0, "lexical": 1.0})
    normalization: Literal["minmax", "zscore"] = "minmax"
    alpha: float = Field(default=0.5, ge=0.0, le=1.0, description="weight of the dense arm")

    @field_validator("weights")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) - {"dense", "lexical"}:
            raise ValueError("weights may name only 'dense' and 'lexical'")
        if any(w < 0 for w in value.values()):
            raise ValueError("weights must be >= 0")
        return value


class CandidateDepth(Strict):
    dense: int = Field(default=50, ge=1, le=1000)
    lexical: int = Field(default=50, ge=1, le=1000)


class Rerank(Strict):
    enabled: bool = False
    window: int = Field(default=20, ge=1, le=200)
    budget_ms: int = Field(default=2000, ge=1, le=30000)


class LexicalOptions(Strict):
    """How the BM25 arm weighs fields; unset values come from the settings."""

    field_boosts: dict[str, float] | None = Field(
        default=None, description="per field (title, section, text), in (0, 100]"
    )
    tie_breaker: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="multi_match best_fields: share of the other fields' scores added to the best",
    )

    @field_validator("field_boosts")
    @classmethod
    def _boosts(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value or set(value) - set(LEXICAL_FIELDS):
            raise ValueError(f"field_boosts may name only {', '.join(LEXICAL_FIELDS)}")
        if any(not 0 < boost <= 100 for boost in value.values()):
            raise ValueError("field boosts must be in (0, 100]")
        return value


class Mmr(Strict):
    lambda_: float = Field(default=0.7, ge=0.0, le=1.0, alias="lambda")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PolicyOverrides(Strict):
    score_type: Literal["dense_cosine", "rerank"] | None = None
    min_score: float | None = Field(default=None, ge=-100, le=100)
    token_budget: int | None = Field(default=None, ge=16, le=8192)
    max_chunks_per_document: int | None = Field(default=None, ge=1, le=50)
    near_duplicate_threshold: float | None = Field(default=None, ge=0.5, le=1.0)


class SearchRequest(Strict):
    query: str = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=10, ge=1, le=100)
    mode: Mode = "hybrid"
    filters: Filters = Field(default_factory=Filters)
    fusion: Fusion = Field(default_factory=Fusion)
    candidate_depth: CandidateDepth = Field(default_factory=CandidateDepth)
    rerank: Rerank = Field(default_factory=Rerank)
    mmr: Mmr | None = None
    per_document_cap: int | None = Field(default=None, ge=1, le=100)
    policy: PolicyOverrides = Field(default_factory=PolicyOverrides)
    lexical: LexicalOptions = Field(default_factory=LexicalOptions)
    profile: str | None = Field(
        default=None,
        pattern=PROFILE_NAME,
        description="A saved search profile of the caller's tenant; fields set in the request "
        "replace the profile's fields of the same name",
    )
    explain: bool = False

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must contain non-whitespace text")
        return value
