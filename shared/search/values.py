"""The values one search passes from stage to stage (shared/search/service.py composes them):

    Query → Arms (retrieve) → Retrieved (fusion) → Candidates (hydrate)
          → Ranked (rerank, diversify) → PolicyResult (decide) → SearchResponse (respond)

Each stage takes values and returns a new one; none reaches back into the service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from shared.answerability.schemas import AnswerabilityTrace
from shared.search.coverage import CorpusCounts
from shared.search.schemas import (
    Decision,
    DecisionReason,
    EvidenceItem,
    Omission,
    OmissionReason,
    SearchRequest,
    TermCoverage,
    VerifyReason,
)
from shared.settings import Settings
from shared.stores.schemas import ArmHit

if TYPE_CHECKING:
    from shared.answerability.service import LoadedModel


@dataclass(frozen=True)
class Query:
    """Whose search, what it asks (the request with its profile applied), with which
    settings, and the models it resolved (resolve.py)."""

    tenant_id: str
    request: SearchRequest
    settings: Settings
    answerability: LoadedModel | None = None
    trained_reranker: str | None = None  # the files of the tenant's reranker it names
    embedding_cache: bool = True  # False: the query is encoded even when the cache holds it
    # The tenant's dense-score threshold set from its own corpus (calibration.py), if any.
    calibrated_min_score: float | None = None

    @property
    def coverage_decides(self) -> bool:
        """Whether the decision reads term coverage: the default decision does (a score type
        other than the learned answerability model, coverage not turned off)."""
        return self.request.policy.score_type != "answerability" and self.settings.policy_coverage


@dataclass(frozen=True)
class Arms:
    """What the arms found: each arm's hits, the arms that could not answer, the vector."""

    hits: dict[str, list[ArmHit]]
    degraded: list[str]
    vector: list[float]
    counts: CorpusCounts | None = None  # the corpus's chunks holding each query term


@dataclass(frozen=True)
class ReadAhead:
    """Chunks a search hydrated before its hydrate stage (the passages stage's candidates,
    which hold the likely results): ``rows`` has the row of every live one among ``ids``, so
    an id of ``ids`` it lacks is not live. The first page's hydration takes these rows
    instead of reading them again."""

    ids: frozenset[str]
    rows: Mapping[str, Any]


NOTHING_READ_AHEAD = ReadAhead(frozenset(), MappingProxyType({}))  # shared: read-only


@dataclass(frozen=True)
class Retrieved:
    """Everything a page of results is built from (a paginated search's cursor keeps it,
    all but ``read_ahead``: a later page reads its chunks when it is asked for): each arm's
    hits, the arms that could not answer, the query vector, the fused ranking."""

    arms: dict[str, list[ArmHit]]
    degraded: list[str]
    vector: list[float]
    fused: list[tuple[str, float]]
    counts: CorpusCounts | None = None
    read_ahead: ReadAhead = NOTHING_READ_AHEAD


@dataclass
class Candidates:
    """The live chunks of a page's part of the fused ranking, in fused order; the hits
    Postgres does not hold live are dropped (counted) and named for a purge."""

    items: list[Candidate]
    dropped: int = 0
    stale: list[str] = field(default_factory=list)


# What the rerank stage said of each chunk it rescored: chunk id -> (rerank score, rank change).
RerankInfo = dict[str, tuple[float, int]]


@dataclass
class Ranked:
    """Candidates in their final order (reranked, diversified, capped per document) and
    what the rerank stage said of each (score, rank change)."""

    items: list[Candidate]
    results: list[Candidate]  # the page: the first top_k within the per-document cap
    rerank: RerankInfo = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)


@dataclass
class Candidate:
    chunk_id: str
    document_id: str
    external_id: str | None
    title: str
    version: int | None
    section: str
    char_start: int | None
    char_end: int | None
    indexed_at: str | None
    text: str
    token_count: int
    embedding: np.ndarray | None
    scores: dict[str, float]
    flags: list[str] = field(default_factory=list)  # from ingest, e.g. doubtful_extraction
    first_sentence_tokens: int | None = None  # from ingest; None: counted here if needed
    copies: list[Candidate] = field(default_factory=list)  # the same text in other chunks
    # How well its text answers the question (passages.PassageMatch.proximity), when the
    # decision measured it: the per-document cap keeps a document's best-matching chunks.
    answer_match: float | None = None
    whole_document: bool = False  # its document's only chunk: never a crumb of a longer one


# -- the evidence policy's (decide.py, policy.py)

ScoreType = Literal["dense_cosine", "rerank", "answerability"]
# Where the threshold came from: the request (or its profile), the tenant's calibration
# (shared/search/calibration.py), the deployment's default, or the answerability model.
ThresholdSource = Literal["request", "calibrated", "default", "model"]
Status = Literal["answerable", "verify", "abstain"]
# Flags on the top evidence item that make an answer one to check before use.
VERIFY_FLAGS: tuple[VerifyReason, ...] = ("possible_prompt_injection", "doubtful_extraction")


class TokenCounter(Protocol):
    """Counts tokens with the embedder's own tokenizer."""

    def __call__(self, text: str) -> int: ...

    def prefix_counts(self, text: str, ends: list[int]) -> list[int]:
        """The token count of ``text[:end]`` for each of ``ends`` (ascending), from one pass."""
        ...


@dataclass(frozen=True)
class PolicyConfig:
    score_type: ScoreType
    min_score: float
    token_budget: int
    max_chunks_per_document: int
    near_duplicate_threshold: float
    # With score_type "answerability": the model's judgement of this query (None when it
    # could not be made, e.g. an arm was down), and the probability below which to verify.
    answerability: AnswerabilityTrace | None = None
    # The default decision's term coverage (None: the score alone decides) and its bounds.
    coverage: TermCoverage | None = None
    absent_weight_abstain: float = 0.15
    coverage_abstain: float = 0.3
    coverage_answer: float = 0.6
    # The request spreads its results over documents (a per-document cap under the evidence
    # results, or MMR): first results of as many documents say nothing of the corpus then.
    results_spread: bool = False
    threshold_source: ThresholdSource = "default"


@dataclass
class PolicyResult:
    status: Status
    reason: DecisionReason | None
    score_type: ScoreType
    threshold: float
    top_score: float | None
    evidence: list[EvidenceItem] = field(default_factory=list)
    omitted: list[Omission] = field(default_factory=list)
    tokens_used: int = 0
    token_budget: int = 0
    # each result's fate: included, or why not
    per_result: dict[str, OmissionReason | Literal["included", "included_truncated"]] = field(
        default_factory=dict
    )
    answerability: AnswerabilityTrace | None = None
    coverage: TermCoverage | None = None
    threshold_source: ThresholdSource = "default"

    def omit(self, c: Candidate, reason: OmissionReason) -> None:
        """Leave ``c`` out of the evidence, saying why."""
        self.omitted.append(Omission(chunk_id=c.chunk_id, reason=reason))
        self.per_result[c.chunk_id] = reason

    def decision(self) -> Decision:
        decision = Decision(
            status=self.status,
            reason=self.reason,
            score_type=self.score_type,
            threshold=self.threshold,
            threshold_source=self.threshold_source,
            top_score=self.top_score,
        )
        if self.answerability is not None:  # set only then: the response leaves unset out
            decision.verify_below = self.answerability.verify_below
            decision.answerability = self.answerability
        if self.coverage is not None:
            decision.coverage = self.coverage
        return decision
