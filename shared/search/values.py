"""The values one search passes from stage to stage (shared/search/service.py composes them):

    Query → Arms (retrieve) → Retrieved (fusion) → Candidates (hydrate)
          → Ranked (rerank, diversify) → Decided (decide) → SearchResponse (respond)

Each stage takes values and returns a new one; none reaches back into the service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.search.coverage import CorpusCounts
from shared.search.policy import Candidate, PolicyResult
from shared.search.schemas import SearchRequest
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


@dataclass(frozen=True)
class Arms:
    """What the arms found: each arm's hits, the arms that could not answer, the vector."""

    hits: dict[str, list[ArmHit]]
    degraded: list[str]
    vector: list[float]
    counts: CorpusCounts | None = None  # the corpus's chunks holding each query term


@dataclass(frozen=True)
class Retrieved:
    """Everything a page of results is built from (a paginated search's cursor keeps it):
    each arm's hits, the arms that could not answer, the query vector, the fused ranking."""

    arms: dict[str, list[ArmHit]]
    degraded: list[str]
    vector: list[float]
    fused: list[tuple[str, float]]
    counts: CorpusCounts | None = None


@dataclass
class Candidates:
    """The live chunks of a page's part of the fused ranking, in fused order; the hits
    Postgres does not hold live are dropped (counted) and named for a purge."""

    items: list[Candidate]
    dropped: int = 0
    stale: list[str] = field(default_factory=list)


@dataclass
class Ranked:
    """Candidates in their final order (reranked, diversified, capped per document) and
    what the rerank stage said of each (score, rank change)."""

    items: list[Candidate]
    results: list[Candidate]  # the page: the first top_k within the per-document cap
    rerank: dict[str, tuple[float, int]] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)


@dataclass
class Decided:
    """The evidence policy's decision over the page's results."""

    policy: PolicyResult
