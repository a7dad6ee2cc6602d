"""The search request: every option validated up front, so bad input is a 422 that says what
is wrong, never a store error. Unknown fields are rejected, not ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    create_model,
    field_validator,
)

from shared.answerability.schemas import AnswerabilityTrace
from shared.fields import STRICT, MetadataKey, Strict
from shared.stores.filters import Filters

Mode = Literal["dense", "lexical", "hybrid"]
NonNegativeFloat = Annotated[float, Field(ge=0)]


def _integral(value: Any) -> Any:
    """JSON Schema counts 1.0 as an integer; strict mode would not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_integral)]
Arm = Literal["dense", "lexical"]
FieldBoost = Annotated[float, Field(gt=0, le=100)]
PROFILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def _default_weights() -> dict[Arm, float]:
    """BM25 a little above the dense arm: on real documentation (names, options, versions
    that all-MiniLM-L6-v2 reads poorly) the answer's chunk was often first by BM25 and past
    20th by cosine. Development set (evaluation/devsets/real-docs), answer chunk in the top 5
    at lexical weight 1.0 / 1.3 / 1.6: 0.905 / 0.932 / 0.919, MRR@10 0.948 / 0.955 / 0.955;
    SciFact test nDCG@10 of hybrid RRF 0.7180 at 1.0, 0.7196 at 1.3."""
    return {"dense": 1.0, "lexical": 1.3}


class Fusion(Strict):
    method: Literal["rrf", "convex"] = Field(
        default="rrf",
        description='"rrf": reciprocal rank fusion of the two rankings; "convex": a weighted sum '
        "of the arms' normalized scores (alpha)",
    )
    k: Int = Field(
        default=60, ge=1, le=1000, description="rrf: a result at rank r adds weight / (k + r)"
    )
    weights: dict[Arm, NonNegativeFloat] = Field(
        default_factory=_default_weights, description="rrf: each arm's weight (dense, lexical)"
    )
    normalization: Literal["minmax", "zscore"] = Field(
        default="minmax", description="convex: how each arm's scores are scaled before the sum"
    )
    alpha: float = Field(default=0.5, ge=0.0, le=1.0, description="weight of the dense arm")


class CandidateDepth(Strict):
    dense: Int = Field(
        default=50, ge=1, le=1000, description="candidates the dense arm (pgvector) returns"
    )
    lexical: Int = Field(
        default=50, ge=1, le=1000, description="candidates the lexical arm (BM25) returns"
    )


class Rerank(Strict):
    enabled: bool = Field(default=False, description="rerank the first fused candidates")
    window: Int = Field(
        default=20, ge=1, le=200, description="how many of the first candidates are reranked"
    )
    budget_ms: Int = Field(
        default=2000,
        ge=1,
        le=30000,
        description="the reranker's time budget: past it the fused order stands and the "
        "response says it is degraded",
    )
    model: str | None = Field(
        default=None,
        pattern=PROFILE_NAME,
        description="A trained reranker of the caller's tenant (concord reranker train); "
        "unset: the configured CONCORD_RERANK_KIND / CONCORD_RERANK_MODEL",
    )
    blend: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Weight of the reranker's score against the fused score, each min-max "
        "normalized over the window (1: the reranker alone). Unset: 1 for the configured "
        "reranker; for a trained one, the blend chosen on its validation queries",
    )


class LexicalOptions(Strict):
    """How the BM25 arm weighs fields; unset values come from the settings."""

    field_boosts: dict[Literal["title", "section", "text"], FieldBoost] | None = Field(
        default=None, min_length=1, description="per field (title, section, text), in (0, 100]"
    )
    tie_breaker: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="multi_match best_fields: share of the other fields' scores added to the best",
    )


class Mmr(Strict):
    lambda_: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        alias="lambda",
        description="relevance against diversity: 1 ranks by relevance alone, 0 by novelty",
    )

    model_config = ConfigDict(**STRICT, populate_by_name=True)


class Boost(Strict):
    """Lift results by a metadata value, after fusion, so that it applies the same way to a hit
    of either arm: fused score + weight x f x (the spread of the fused scores), f in [0, 1].
    ``recency``: f halves every
    ``half_life_days`` of the value's age (an ISO-8601 date; a future date counts as today);
    ``numeric``: f is the value min-max scaled over the candidates. A candidate without the
    value (or with one of another type) gets f = 0."""

    field: MetadataKey = Field(description="the metadata key whose value lifts a result")
    kind: Literal["recency", "numeric"] = Field(
        default="recency",
        description='"recency": a date, newer lifts more; "numeric": a number, larger lifts more',
    )
    weight: float = Field(
        default=0.5, gt=0, le=10, description="the lift of f = 1, in spreads of the fused scores"
    )
    half_life_days: float = Field(
        default=365.0, gt=0, le=36500, description="recency: the age at which the lift halves"
    )


class PolicyOverrides(Strict):
    score_type: Literal["dense_cosine", "rerank", "answerability"] | None = Field(
        default=None,
        description='the score the decision reads besides the term coverage: "dense_cosine", '
        '"rerank" (with rerank enabled) or "answerability" (a model learned from judgements); '
        "default CONCORD_POLICY_SCORE_TYPE",
    )
    min_score: float | None = Field(
        default=None,
        ge=-100,
        le=100,
        description="the abstain threshold (for answerability: on its probability; default "
        "the one stored with the model)",
    )
    answerability_model: str | None = Field(
        default=None,
        pattern=PROFILE_NAME,
        description='with score_type "answerability": the tenant\'s model (default "default")',
    )
    verify_below: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description='with score_type "answerability": verify below this probability '
        "(default the model's answer threshold)",
    )
    token_budget: Annotated[int, Field(ge=16, le=8192), BeforeValidator(_integral)] | None = Field(
        default=None,
        description="the evidence's size in the embedder's tokens; what does not fit is "
        "omitted (over_budget); default CONCORD_POLICY_TOKEN_BUDGET",
    )
    max_chunks_per_document: (
        Annotated[int, Field(ge=1, le=50), BeforeValidator(_integral)] | None
    ) = Field(
        default=None,
        description="evidence chunks from one document at most; default "
        "CONCORD_POLICY_MAX_CHUNKS_PER_DOCUMENT",
    )
    near_duplicate_threshold: float | None = Field(
        default=None,
        ge=0.5,
        le=1.0,
        description="an evidence chunk this similar (cosine) to one already in is omitted "
        "(near_duplicate); default CONCORD_POLICY_NEAR_DUPLICATE_THRESHOLD",
    )


class SearchRequest(Strict):
    query: str = Field(min_length=1, max_length=2000, description="the question or keywords")
    top_k: Int = Field(default=10, ge=1, le=100, description="how many results")
    mode: Mode = Field(
        default="hybrid",
        description='"hybrid": both arms fused; "dense": pgvector cosine only; "lexical": '
        "Elasticsearch BM25 only (score is then the arm's own score)",
    )
    filters: Filters = Field(
        default_factory=Filters, description="which chunks may be found, applied in both arms"
    )
    fusion: Fusion = Field(default_factory=Fusion, description="how hybrid fuses the two arms")
    candidate_depth: CandidateDepth = Field(
        default_factory=CandidateDepth, description="how many candidates each arm returns"
    )
    rerank: Rerank = Field(default_factory=Rerank, description="cross-encoder reranking")
    mmr: Mmr | None = Field(
        default=None, description="diversify the results by maximal marginal relevance"
    )
    per_document_cap: Annotated[int, Field(ge=1, le=100), BeforeValidator(_integral)] | None = (
        Field(default=None, description="results from one document at most")
    )
    policy: PolicyOverrides = Field(
        default_factory=PolicyOverrides,
        description="the evidence decision's settings for this request",
    )
    lexical: LexicalOptions = Field(
        default_factory=LexicalOptions, description="how the BM25 arm weighs fields"
    )
    profile: str | None = Field(
        default=None,
        pattern=PROFILE_NAME,
        description="A saved search profile of the caller's tenant; fields set in the request "
        "replace the profile's fields of the same name",
    )
    explain: bool = Field(
        default=False,
        description="add each result's rank trace (each arm's rank and score, fusion, rerank) "
        "and the signals the decision read",
    )
    group_by: Literal["document"] | None = Field(
        default=None,
        description='"document": also return the results grouped by document (documents in '
        "the order of their best result, each with its results best first); per_document_cap "
        "bounds the chunks per document",
    )
    boost: Boost | None = Field(default=None, description="lift results by a metadata value")
    paginate: bool = Field(
        default=False,
        description="return next_cursor for the results after these top_k (POST "
        "/v1/search/next); pages follow this search's ranking whatever is written meanwhile",
    )
    highlight: bool = Field(
        default=False,
        description="add each result's matched query terms as character offsets into its text",
    )

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must contain non-whitespace text")
        return value


# A search profile holds any search request fields except these.
NOT_IN_PROFILE = frozenset({"query", "profile", "explain"})

ProfileSettings = create_model(  # type: ignore[call-overload]
    "ProfileSettings",
    __config__=STRICT,
    __doc__="Search request fields a profile sets (all optional; query, profile and explain "
    "belong to each request)",
    **{
        name: (field.annotation, field)
        for name, field in SearchRequest.model_fields.items()
        if name not in NOT_IN_PROFILE
    },
)


# ------------------------------------------------------------------ the response


class Provenance(BaseModel):
    document_id: str
    external_id: str | None
    version: int | None
    section: str
    char_start: int
    char_end: int
    indexed_at: str | None


class EvidenceItem(BaseModel):
    """A chunk packed into the token budget (whole sentences only), with where it came from
    and flags such as ``possible_prompt_injection``."""

    chunk_id: str
    text: str
    tokens: int
    truncated: bool
    flags: list[str]
    score: float | None
    provenance: Provenance


# Why a decision abstained, or asks to verify (shared/search/policy.py).
AbstainReason = Literal[
    "no_hits",
    "all_filtered",
    "below_threshold",
    "unlikely_answerable",
    "score_unavailable",
    "missing_provenance",
    "over_budget",
    "query_terms_absent",
    "evidence_does_not_cover_query",
]
VerifyReason = Literal[
    "uncertain_answerability",
    "answerability_unavailable",
    "possible_prompt_injection",
    "doubtful_extraction",
    "partial_coverage",
    "answer_not_stated",
]
DecisionReason = Literal[AbstainReason, VerifyReason]
# Why a result is not among the evidence.
OmissionReason = Literal[
    "below_threshold",
    "score_unavailable",
    "missing_provenance",
    "query_terms_absent",
    "query_unlikely_answerable",
    "evidence_does_not_cover_query",
    "per_document_cap",
    "near_duplicate",
    "over_budget",
]


class Omission(BaseModel):
    chunk_id: str
    reason: OmissionReason = Field(description="why this result is not among the evidence")


class Evidence(BaseModel):
    items: list[EvidenceItem]
    token_budget: int
    tokens_used: int
    omitted: list[Omission]


class TermCoverage(BaseModel):
    """What the decision read of the question's informative terms (shared/search/coverage.py):
    those the tenant's corpus holds nowhere, those the first results do not hold, and the
    shares of the terms' weight (inverse document frequency in the tenant's corpus)."""

    terms: list[str] = Field(default_factory=list, description="the informative words")
    absent: list[str] = Field(default_factory=list, description="held by no chunk of the corpus")
    uncovered: list[str] = Field(
        default_factory=list, description="in the corpus, not in the first results"
    )
    absent_weight: float = Field(default=0.0, description="the absent terms' share of the weight")
    absent_names_weight: float = Field(
        default=0.0,
        description="the share of the absent terms that are names (no English word, or written "
        "as an identifier): what the corpus lacks, where an absent English word may be wording",
    )
    wording: list[str] = Field(
        default_factory=list,
        description="absent English words that are not what the question is about: the "
        "asker's wording, which weighs nothing",
    )
    covered: float = Field(default=1.0, description="the first results' share of the weight")
    documents: int = Field(
        default=1, description="how many documents the first three results come from"
    )
    document_covered: float = Field(
        default=1.0,
        description="the largest share of the weight that one document's first results hold",
    )
    unstated: list[str] = Field(
        default_factory=list,
        description="what the question asks for that the first results do not state: "
        '"default", "version", or a version it names',
    )


class Decision(BaseModel):
    """``answerable``; ``verify`` with the reason (``uncertain_answerability``,
    ``answerability_unavailable``, ``possible_prompt_injection``, ``doubtful_extraction``):
    evidence to check before use; or ``abstain`` with the reason (``no_hits``,
    ``all_filtered``, ``below_threshold``, ``unlikely_answerable``, ``score_unavailable``,
    ``missing_provenance``, ``over_budget``, ``query_terms_absent``,
    ``evidence_does_not_cover_query``); the default decision's ``verify`` reason
    ``partial_coverage`` says the first results hold only part of what the question asks."""

    status: Literal["answerable", "verify", "abstain"]
    reason: DecisionReason | None = Field(
        description="why it abstains or asks to verify; null when answerable"
    )
    score_type: Literal["dense_cosine", "rerank", "answerability"]
    threshold: float
    threshold_source: Literal["request", "calibrated", "default", "model"] = Field(
        default="default",
        description="where the threshold came from: the request or its profile, the tenant's "
        "calibration from its own corpus (concord calibrate), the deployment's default "
        "(CONCORD_POLICY_MIN_SCORE), or the answerability model",
    )
    top_score: float | None = Field(
        description="the best score judged (for answerability: the probability)"
    )
    verify_below: float | None = None
    answerability: AnswerabilityTrace | None = None
    coverage: TermCoverage | None = Field(
        default=None, description="the term coverage the default decision read"
    )


class RankScore(BaseModel):
    rank: int
    score: float


class RerankTrace(BaseModel):
    score: float
    rank_change: int


class Trace(BaseModel):
    """How a result got where it is: each arm's rank and score, the fused ones, the rerank
    score and rank change, and what the policy decided for it."""

    dense: RankScore | None
    lexical: RankScore | None
    fused: RankScore
    rerank: RerankTrace | None
    final_rank: int
    policy: str


class Copy(BaseModel):
    """Another chunk of the same text as a result: where else it is."""

    chunk_id: str
    document_id: str
    external_id: str | None
    title: str
    section: str


class SearchResult(BaseModel):
    chunk_id: str
    document_id: str
    external_id: str | None
    title: str
    version: int | None
    section: str
    text: str
    char_start: int | None
    char_end: int | None
    indexed_at: str | None
    score: float = Field(
        description="what the mode ranks by: hybrid, the fused score; dense, the cosine; "
        "lexical, the BM25 score"
    )
    found_by: list[Arm]
    scores: dict[str, float] = Field(description="dense_cosine, and rerank when reranked")
    flags: list[str] = Field(
        default_factory=list,
        description="what ingest noticed about the chunk's text: ocr (read from a page image "
        "by OCR), doubtful_extraction (a thin or garbled text layer, or OCR: check before use)",
    )
    trace: Trace | None = Field(default=None, description="with explain")
    copies: list[Copy] | None = Field(
        default=None,
        description="other chunks of the same text (another document holding the same page), "
        "shown once as this result",
    )
    highlights: list[tuple[int, int]] | None = Field(
        default=None,
        description="with highlight: [start, end) offsets into text of the words that match a "
        "query term (as BM25 matches them: lowercased, stemmed, stop words dropped)",
    )


class DocumentGroup(BaseModel):
    """One document among the results, with its results (best first)."""

    document_id: str
    external_id: str | None
    title: str
    score: float = Field(description="its best result's fused score")
    results: list[SearchResult]


class SearchResponse(BaseModel):
    # Every search's stage timings (ms), also without explain: the API sends them in a
    # Server-Timing header, so a caller can see where the time went without asking for the
    # per-result traces (which cost about 1 ms of a 100-result search).
    _stage_ms: dict[str, float] = PrivateAttr(default_factory=dict)
    # The hits found stale (Postgres does not hold them live): their copies' purges are
    # queued once the response is made (shared/search/service.queue_purges).
    _stale: list[str] = PrivateAttr(default_factory=list)

    query: str
    mode: Mode
    degraded: list[str] = Field(
        description="dense_unavailable, lexical_unavailable, rerank_unavailable"
    )
    dropped_stale: int = Field(description="hits Postgres does not hold live, dropped")
    decision: Decision
    results: list[SearchResult]
    evidence: Evidence
    timings_ms: dict[str, float] | None = Field(default=None, description="with explain")
    groups: list[DocumentGroup] | None = Field(default=None, description="with group_by")
    next_cursor: str | None = Field(
        default=None,
        description="with paginate: pass to POST /v1/search/next for the next page; null at "
        "the end",
    )

    @property
    def stage_ms(self) -> dict[str, float]:
        return self._stage_ms

    def server_timing(self) -> str:
        """The stage timings as a Server-Timing header value: ``embed;dur=4.6, dense;dur=4.5``."""
        return ", ".join(f"{stage};dur={ms}" for stage, ms in self._stage_ms.items())


class SearchPage(Strict):
    cursor: str = Field(
        min_length=4,
        max_length=200,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="next_cursor of the previous page",
    )
