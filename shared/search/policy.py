"""The evidence policy: decide whether the results can answer the query, and pack the evidence.

Thresholds apply only to a declared score type (dense cosine, the rerank score, or the
calibrated probability of a learned answerability model), never to fused ranks. The decision
is ``answerable``, ``verify`` (evidence is there but should be checked before use: the
probability lies between the abstain and answer thresholds, or the top evidence is flagged
``possible_prompt_injection`` or ``doubtful_extraction``) or ``abstain``, each but the first
with a reason. Evidence is packed
into a token budget without cutting sentences, with a per-document cap and near-duplicate
suppression, and every omission is reported with its reason. Text that reads like an
instruction to a language model is flagged, never acted on.
"""

from __future__ import annotations

from typing import Literal

from shared.search.coverage import EVIDENCE_RESULTS
from shared.search.packing import (
    LoadEmbeddings,
    pack,
)
from shared.search.schemas import (
    Omission,
    TermCoverage,
)
from shared.search.values import (
    VERIFY_FLAGS,
    Candidate,
    PolicyConfig,
    PolicyResult,
    TokenCounter,
)


def _has_provenance(c: Candidate) -> bool:
    return bool(
        c.document_id
        and c.external_id
        and c.version is not None
        and c.char_start is not None
        and c.char_end is not None
    )


def apply_policy(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    *,
    dropped_before: int = 0,
    load_embeddings: LoadEmbeddings | None = None,
) -> PolicyResult:
    """``load_embeddings`` returns copies of the candidates it is given with ``embedding``
    filled in where it can (the search reads them from Postgres): near-duplicate suppression
    calls it only for candidates it compares, those it reaches while the budget lasts."""
    result = PolicyResult(
        "abstain",
        None,
        config.score_type,
        config.min_score,
        None,
        token_budget=config.token_budget,
        threshold_source=config.threshold_source,
    )
    if not candidates:
        result.reason = "all_filtered" if dropped_before else "no_hits"
        return result
    if config.score_type == "answerability":
        return _judge_query(candidates, config, count_tokens, result, load_embeddings)
    result.coverage = config.coverage

    scored = _above_threshold(candidates, config, result)
    if not scored:
        reasons = set(result.per_result.values())
        result.reason = next(
            r
            for r in ("below_threshold", "score_unavailable", "missing_provenance")
            if r in reasons
        )
        return result

    if (
        config.coverage is not None
        and config.coverage.absent_names_weight >= config.absent_weight_abstain
    ):
        for c in scored:
            result.omit(c, "query_terms_absent")
        result.reason = "query_terms_absent"
        return result
    pack(scored, config, count_tokens, result=result, load_embeddings=load_embeddings)
    _decide_on_evidence(result)
    if result.status == "answerable" and config.coverage is not None:
        _decide_on_coverage(result, config.coverage, config)
    return result


def _above_threshold(
    candidates: list[Candidate], config: PolicyConfig, result: PolicyResult
) -> list[Candidate]:
    """The candidates with provenance and a score of the declared type at or above the
    threshold; the others are omitted with their reason. Sets the result's top score."""
    scored: list[Candidate] = []
    for c in candidates:
        score = c.scores.get(config.score_type)
        if not _has_provenance(c):
            result.omit(c, "missing_provenance")
        elif score is None:
            result.omit(c, "score_unavailable")
        elif score < config.min_score:
            result.omit(c, "below_threshold")
        else:
            scored.append(c)
    present = [c.scores[config.score_type] for c in candidates if config.score_type in c.scores]
    result.top_score = round(max(present), 6) if present else None
    return scored


def _decide_on_coverage(result: PolicyResult, coverage: TermCoverage, config: PolicyConfig) -> None:
    """Evidence that holds too little of what the question asks about is no answer (abstain,
    nothing packed), and so is evidence that shares one word with a question of several: a
    word in common is not coverage; nor is evidence scattered over as many documents as it
    has results, none of which holds what an answer needs (``coverage_answer``): each
    shares a word or two with the question, and none is about it. Evidence that holds part
    of it, or that does not state what the question asks for (a default, a version), is one
    to check (verify)."""
    weighed = len(coverage.terms) - len(coverage.wording)
    held = len(coverage.terms) - len(coverage.uncovered) - len(coverage.absent)
    thin = coverage.covered < config.coverage_abstain or (weighed >= 3 and held <= 1)
    scattered = (
        not config.results_spread
        and coverage.documents >= EVIDENCE_RESULTS
        and coverage.document_covered < config.coverage_answer
    )
    if thin or scattered:
        # Where the missing weight is mostly words the corpus never uses, say so.
        missing_elsewhere = 1.0 - coverage.covered - coverage.absent_weight
        reason: Literal["query_terms_absent", "evidence_does_not_cover_query"] = (
            "query_terms_absent"
            if thin and coverage.absent and coverage.absent_weight >= missing_elsewhere
            else "evidence_does_not_cover_query"
        )
        for item in result.evidence:
            result.omitted.append(Omission(chunk_id=item.chunk_id, reason=reason))
            result.per_result[item.chunk_id] = reason
        result.evidence, result.tokens_used = [], 0
        result.status, result.reason = "abstain", reason
    elif coverage.covered < config.coverage_answer:
        result.status, result.reason = "verify", "partial_coverage"
    elif coverage.unstated:
        result.status, result.reason = "verify", "answer_not_stated"


def _judge_query(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    result: PolicyResult,
    load_embeddings: LoadEmbeddings | None,
) -> PolicyResult:
    """The answerability model judges the query, not each result: below its abstain
    threshold nothing is packed; otherwise every result with provenance may be."""
    judged = config.answerability
    result.answerability = judged
    if judged is not None:
        result.top_score = judged.probability
        if judged.probability < config.min_score:
            for c in candidates:
                result.omit(c, "query_unlikely_answerable")
            result.reason = "unlikely_answerable"
            return result
    packable = []
    for c in candidates:
        if _has_provenance(c):
            packable.append(c)
        else:
            result.omit(c, "missing_provenance")
    if not packable:
        result.reason = "missing_provenance"
        return result
    pack(packable, config, count_tokens, result=result, load_embeddings=load_embeddings)
    _decide_on_evidence(result)
    if result.status == "answerable":
        if judged is None:
            result.status, result.reason = "verify", "answerability_unavailable"
        elif judged.probability < judged.verify_below:
            result.status, result.reason = "verify", "uncertain_answerability"
    return result


def _decide_on_evidence(result: PolicyResult) -> None:
    """Answerable when something was packed, unless the top evidence is to be checked first."""
    if not result.evidence:
        result.reason = "over_budget"
        return
    result.status = "answerable"
    flagged = [f for f in VERIFY_FLAGS if f in result.evidence[0].flags]
    if flagged:
        result.status, result.reason = "verify", flagged[0]
