"""Decide: the evidence policy over the page's results (answerable or abstain with a reason,
evidence packed into a token budget), and, where the request asks for it, the tenant's
answerability model's judgement of the query from both arms' scores."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from shared.answerability.features import RERANK_WINDOW
from shared.answerability.schemas import AnswerabilityTrace
from shared.ingest.embedding import get_embedder
from shared.rerankers.scoring import get_trained_reranker, rerank_passage, rerank_within_budget
from shared.search.coverage import EVIDENCE_RESULTS, CorpusCounts, QueryTerms, coverage
from shared.search.passages import Question
from shared.search.policy import apply_policy
from shared.search.values import (
    Candidate,
    Candidates,
    PolicyConfig,
    PolicyResult,
    Query,
    RerankInfo,
    Retrieved,
    ThresholdSource,
)
from shared.stores.schemas import document_of_chunk

log = logging.getLogger(__name__)


def decide(
    query: Query,
    results: list[Candidate],
    *,
    dropped: int,
    judged: AnswerabilityTrace | None,
    reranked: bool,
    load_embeddings: Callable[[list[Candidate]], list[Candidate]],
    counts: CorpusCounts | None = None,
) -> PolicyResult:
    """The policy's decision over ``results``. Near-duplicate suppression compares the
    embeddings of the results it considers while the budget lasts; those hydrated without
    them are read (``load_embeddings``) when it gets there. With ``counts`` (the corpus's
    chunks holding each query term), the default decision reads term coverage too."""
    config = policy_config(query, reranked, judged)
    results = with_answer_matches(
        results, query.request.query, counts, cap=config.max_chunks_per_document
    )
    if counts is not None and query.coverage_decides:
        first = results[:EVIDENCE_RESULTS]
        evidence = [f"{c.title}\n{c.section}\n{c.text}" for c in first]
        config = replace(
            config,
            coverage=coverage(
                QueryTerms.of(query.request.query),
                counts,
                evidence,
                query.request.query,
                documents=[c.document_id for c in first],
            ),
        )
    return apply_policy(
        results,
        config,
        TokenizerCounter(),
        dropped_before=dropped,
        load_embeddings=load_embeddings,
    )


def with_answer_matches(
    results: list[Candidate], question_text: str, counts: CorpusCounts | None, *, cap: int
) -> list[Candidate]:
    """``results`` with how well each answers the question (``answer_match``), for the
    documents with more results than the per-document ``cap``: the cap keeps such a
    document's best answers. No other match would be read, and each is a pass over the
    chunk's words (bench/query.py's 10,000-chunk tenant, its dense queries in process: the
    policy stage's mean 5.2-5.7 -> 3.8-4.3 ms, p95 9.3-9.4 -> 6.0-7.3 ms)."""
    per_document = Counter(c.document_id for c in results)
    capped = {d for d, n in per_document.items() if n > cap}
    if not capped:
        return results
    question = Question.of(question_text, counts)
    return [
        replace(c, answer_match=question.match(c.text, c.section).proximity)
        if c.document_id in capped
        else c
        for c in results
    ]


def policy_config(
    query: Query, reranked: bool, judged: AnswerabilityTrace | None = None
) -> PolicyConfig:
    request, settings = query.request, query.settings
    o = request.policy
    score_type = o.score_type or (
        "rerank" if reranked and settings.policy_score_type == "rerank" else "dense_cosine"
    )
    source: ThresholdSource
    if score_type == "answerability" and judged is not None:
        min_score, source = judged.abstain_below, "model"
    elif score_type == "answerability" or o.min_score is not None:
        min_score, source = o.min_score or 0.0, "request"
    elif score_type == "dense_cosine" and query.calibrated_min_score is not None:
        min_score, source = query.calibrated_min_score, "calibrated"
    else:
        min_score, source = settings.policy_min_score, "default"
    return PolicyConfig(
        score_type=score_type,
        min_score=min_score,
        threshold_source=source,
        token_budget=o.token_budget or settings.policy_token_budget,
        max_chunks_per_document=(
            o.max_chunks_per_document or settings.policy_max_chunks_per_document
        ),
        near_duplicate_threshold=(
            o.near_duplicate_threshold or settings.policy_near_duplicate_threshold
        ),
        answerability=judged,
        absent_weight_abstain=settings.policy_absent_weight_abstain,
        coverage_abstain=settings.policy_coverage_abstain,
        coverage_answer=settings.policy_coverage_answer,
        results_spread=request.mmr is not None
        or (request.per_document_cap or EVIDENCE_RESULTS) < EVIDENCE_RESULTS,
    )


# Hydrates fused hits as the page's own are hydrated (the service's hydrate stage, bound to
# the search's query and store): the answerability model's window may reach past the page.
HydrateHits = Callable[[list[tuple[str, float]]], Candidates]


def judge(
    query: Query,
    retrieved: Retrieved,
    page: Candidates,
    *,
    offset: int,
    rerank_info: RerankInfo,
    hydrate_hits: HydrateHits,
) -> tuple[AnswerabilityTrace | None, list[str]]:
    """The model's judgement of the query from both arms' scores (and, for a model that reads
    a reranker, that reranker's scores of the first results in fused order); None if an arm
    or the reranker was unavailable (the policy then asks for verification, not a guess).
    Also the stale hits met on the way that the page had not met (to be purged with its own)."""
    model, arms = query.answerability, retrieved.arms
    if model is None or set(arms) != {"dense", "lexical"}:
        return None, []
    rerank_scores: list[float] | None = None
    stale: list[str] = []
    if model.reranker is not None:
        first, stale = _first_live_results(retrieved, page, offset, hydrate_hits)
        rerank_scores = _first_results_scores(query, first, rerank_info)
        if rerank_scores is None:
            return None, stale
    o = query.request.policy
    trace = model.judge(
        query.request.query,
        arms["dense"],
        arms["lexical"],
        document_of_chunk,
        abstain_below=o.min_score,
        verify_below=o.verify_below,
        rerank_scores=rerank_scores,
    )
    return trace, stale


def _first_live_results(
    retrieved: Retrieved, page: Candidates, offset: int, hydrate_hits: HydrateHits
) -> tuple[list[Candidate], list[str]]:
    """The first RERANK_WINDOW live chunks of the ranking the search serves from (fused, then
    boosted or, for a paginated search, capped per document, as the request asks): the same
    on every page and for any top_k. Taken from the page's hydrated candidates when they hold
    them all, else hydrated here (with the stale hits met that the page had not). The model
    trained on those of a default request."""
    window = [cid for cid, _ in retrieved.fused[:RERANK_WINDOW]]
    by_id = {c.chunk_id: c for c in page.items} if offset == 0 else {}
    if all(cid in by_id for cid in window):
        return [by_id[cid] for cid in window], []
    # Twice the window: room for stale hits, which are dropped as the page's own are.
    more = hydrate_hits(retrieved.fused[: 2 * RERANK_WINDOW])
    return more.items[:RERANK_WINDOW], [cid for cid in more.stale if cid not in page.stale]


def _first_results_scores(
    query: Query, first_results: list[Candidate], rerank_info: RerankInfo
) -> list[float] | None:
    """The answerability model's reranker's scores of ``first_results``: the rerank stage's
    when it ran that reranker over all of them, else scored here (within the rerank budget)."""
    assert query.answerability is not None and query.answerability.reranker_files is not None
    files = query.answerability.reranker_files  # checked against the registry: the live one
    if query.trained_reranker == files and all(c.chunk_id in rerank_info for c in first_results):
        return [rerank_info[c.chunk_id][0] for c in first_results]
    try:
        reranker = get_trained_reranker(files, query.settings)
        return rerank_within_budget(
            reranker,
            query.request.query,
            [rerank_passage(c.title, c.text) for c in first_results],
            query.request.rerank.budget_ms,
        )
    except Exception as e:  # a reranker that cannot load or score must not fail the search
        log.warning("answerability reranker unavailable: %s: %s", type(e).__name__, e)
        return None


class TokenizerCounter:
    """The policy's token counts: the embedder's tokens, as chunk sizes count them (see
    policy.TokenCounter)."""

    def __init__(self) -> None:
        self.token_offsets = get_embedder().token_offsets

    def __call__(self, text: str) -> int:
        return len(self.token_offsets(text))

    def prefix_counts(self, text: str, ends: list[int]) -> list[int]:
        # A prefix ending at a sentence end holds exactly the tokens that start before it.
        starts = [start for start, _ in self.token_offsets(text)]
        return [bisect_left(starts, end) for end in ends]
