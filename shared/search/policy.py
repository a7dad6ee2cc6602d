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

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal, Protocol

import numpy as np

from shared.answerability.schemas import AnswerabilityTrace
from shared.ingest.chunking import first_sentence_end, sentence_spans
from shared.search.schemas import (
    Decision,
    DecisionReason,
    EvidenceItem,
    Omission,
    OmissionReason,
    Provenance,
    TermCoverage,
    VerifyReason,
)

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


INJECTION_PATTERNS = [
    r"\bignore\s+(all\s+|any\s+)?(the\s+)?(previous|prior|above|earlier)\s+"
    r"(instructions|prompts?|messages|context)",
    r"\bdisregard\s+(all\s+|any\s+)?(the\s+)?(previous|prior|above|system)\b",
    r"\bforget\s+(all\s+|everything\s+)?(you|your)\s+(were\s+told|instructions)",
    r"\byou\s+are\s+now\s+(a|an|in)\b",
    r"\b(reveal|print|show)\s+(me\s+)?(the\s+|your\s+)?system\s+prompt",
    r"\bnew\s+instructions\s*:",
    r"\bdo\s+not\s+(tell|inform)\s+the\s+user\b",
    r"<\s*/?\s*(system|assistant|instructions?)\s*>",
]
_INJECTION = re.compile("|".join(INJECTION_PATTERNS), re.IGNORECASE)
# Every pattern above needs one of these words; a text with none of them (casefolded, as
# IGNORECASE matches) cannot match, and skips the regex (66 us a 1 kB chunk).
_INJECTION_WORDS = ("ignore", "disregard", "forget", "you", "prompt", "instruction", "user",
                    "system", "assistant")  # fmt: skip


def looks_like_prompt_injection(text: str) -> bool:
    folded = text.casefold()
    if not any(word in folded for word in _INJECTION_WORDS):
        return False
    return bool(_INJECTION.search(text))


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
    threshold_source: ThresholdSource = "default"


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


def _has_provenance(c: Candidate) -> bool:
    return bool(
        c.document_id
        and c.external_id
        and c.version is not None
        and c.char_start is not None
        and c.char_end is not None
    )


# How many candidates' embeddings to read at once when the packer reaches one without.
EMBEDDINGS_PER_READ = 16
LoadEmbeddings = Callable[[list[Candidate]], None]


def apply_policy(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    *,
    dropped_before: int = 0,
    load_embeddings: LoadEmbeddings | None = None,
) -> PolicyResult:
    """``load_embeddings`` fills in ``embedding`` for those of the given candidates it can
    (the search reads them from Postgres): near-duplicate suppression calls it only for
    candidates it compares, those it reaches while the budget lasts."""
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
            _omit(result, c, "query_terms_absent")
        result.reason = "query_terms_absent"
        return result
    _pack(scored, config, count_tokens, result, load_embeddings)
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
            _omit(result, c, "missing_provenance")
        elif score is None:
            _omit(result, c, "score_unavailable")
        elif score < config.min_score:
            _omit(result, c, "below_threshold")
        else:
            scored.append(c)
    present = [c.scores[config.score_type] for c in candidates if config.score_type in c.scores]
    result.top_score = round(max(present), 6) if present else None
    return scored


def _decide_on_coverage(result: PolicyResult, coverage: TermCoverage, config: PolicyConfig) -> None:
    """Evidence that holds too little of what the question asks about is no answer (abstain,
    nothing packed), and so is evidence that shares one word with a question of several: a
    word in common is not coverage. Evidence that holds part of it, or that does not state
    what the question asks for (a default, a version), is one to check (verify)."""
    weighed = len(coverage.terms) - len(coverage.wording)
    held = len(coverage.terms) - len(coverage.uncovered) - len(coverage.absent)
    if coverage.covered < config.coverage_abstain or (weighed >= 3 and held <= 1):
        # Where the missing weight is mostly words the corpus never uses, say so.
        missing_elsewhere = 1.0 - coverage.covered - coverage.absent_weight
        reason: Literal["query_terms_absent", "evidence_does_not_cover_query"] = (
            "query_terms_absent"
            if coverage.absent and coverage.absent_weight >= missing_elsewhere
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
                _omit(result, c, "query_unlikely_answerable")
            result.reason = "unlikely_answerable"
            return result
    packable = []
    for c in candidates:
        if _has_provenance(c):
            packable.append(c)
        else:
            _omit(result, c, "missing_provenance")
    if not packable:
        result.reason = "missing_provenance"
        return result
    _pack(packable, config, count_tokens, result, load_embeddings)
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


def _omit(result: PolicyResult, c: Candidate, reason: OmissionReason) -> None:
    result.omitted.append(Omission(chunk_id=c.chunk_id, reason=reason))
    result.per_result[c.chunk_id] = reason


def _pack(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    result: PolicyResult,
    load_embeddings: LoadEmbeddings | None,
) -> None:
    packed_by_document: dict[str, list[Candidate]] = {}
    packed_vectors: dict[str, np.ndarray] = {}
    packed: np.ndarray | None = None  # the same, as one matrix (stacked when one changes)
    loaded_before = 0  # candidates before this index have been offered to load_embeddings
    for i, c in enumerate(candidates):
        same_document = packed_by_document.setdefault(c.document_id, [])
        if len(same_document) >= config.max_chunks_per_document:
            # The cap keeps a document's chunks that answer best: a later one that matches
            # the question better than one packed takes its place (a man page's option
            # chunk over a third synopsis chunk of the same page).
            weakest = _weakest(same_document)
            if weakest is None or not _answers_better(c, weakest):
                _omit(result, c, "per_document_cap")
                continue
            _unpack(result, weakest)
            same_document.remove(weakest)
            packed_vectors.pop(weakest.chunk_id, None)
            packed = np.stack(list(packed_vectors.values())) if packed_vectors else None
            _omit(result, weakest, "per_document_cap")
        fitted = _fit(c, config.token_budget - result.tokens_used, count_tokens)
        if fitted is None:
            _omit(result, c, "over_budget")
            continue
        text, tokens, truncated = fitted
        if c.embedding is None and packed is not None and i >= loaded_before and load_embeddings:
            load_embeddings(candidates[i : i + EMBEDDINGS_PER_READ])
            loaded_before = i + EMBEDDINGS_PER_READ
        if (
            c.embedding is not None
            and packed is not None
            # one product with every packed vector at once (a Python loop over them was
            # most of the policy's time on a 100-result list)
            and float(np.max(packed @ c.embedding)) >= config.near_duplicate_threshold
        ):
            _omit(result, c, "near_duplicate")
            continue
        result.tokens_used += tokens
        same_document.append(c)
        if c.embedding is not None:
            packed_vectors[c.chunk_id] = c.embedding
            packed = np.stack(list(packed_vectors.values()))
        result.per_result[c.chunk_id] = "included_truncated" if truncated else "included"
        result.evidence.append(
            _evidence(c, text, tokens, truncated, c.scores.get(config.score_type))
        )


def _fit(c: Candidate, remaining: int, count_tokens: TokenCounter) -> tuple[str, int, bool] | None:
    """The candidate's text within ``remaining`` tokens: whole, or its first whole sentences
    (truncated); None when not even its first sentence fits. Whether it fits comes before
    anything else: it is cheap (most chunks' token counts are stored), and once the budget
    is nearly spent it ends most of a long result list, whose embeddings then are neither
    read nor compared."""
    tokens = c.token_count or count_tokens(c.text)  # 0: a row from before counts
    if tokens <= remaining:
        return c.text, tokens, False
    # Known from ingest that not even its first sentence fits (most of a long list once the
    # budget is nearly spent): its text is not read.
    if (c.first_sentence_tokens or 0) > remaining:
        return None
    text, tokens = _whole_sentences_within(c.text, remaining, count_tokens)
    return (text, tokens, True) if text else None


def _evidence(
    c: Candidate, text: str, tokens: int, truncated: bool, score: float | None
) -> EvidenceItem:
    """The packed passage with its provenance (its offsets those of the text packed)."""
    flags = [*c.flags]
    if looks_like_prompt_injection(text):
        flags.append("possible_prompt_injection")
    start = c.char_start or 0
    return EvidenceItem(
        chunk_id=c.chunk_id,
        text=text,
        tokens=tokens,
        truncated=truncated,
        flags=flags,
        score=score,
        provenance=Provenance(
            document_id=c.document_id,
            external_id=c.external_id,
            version=c.version,
            section=c.section,
            char_start=start,
            char_end=start + len(text) if truncated else (c.char_end or 0),
            indexed_at=c.indexed_at,
        ),
    )


# How much better (in the share of the question's weight held in one window) a chunk past a
# document's cap must answer than one of its packed chunks to take that one's place.
BETTER_ANSWER_MARGIN = 0.1


def _weakest(packed: list[Candidate]) -> Candidate | None:
    """The packed chunk of a document that answers least (the later one of equals); None
    when their match was not measured."""
    measured = [c for c in packed if c.answer_match is not None]
    if not measured:
        return None
    return min(reversed(measured), key=lambda c: c.answer_match or 0.0)


def _answers_better(candidate: Candidate, packed: Candidate) -> bool:
    if candidate.answer_match is None or packed.answer_match is None:
        return False
    return candidate.answer_match >= packed.answer_match + BETTER_ANSWER_MARGIN


def _unpack(result: PolicyResult, c: Candidate) -> None:
    """Take ``c``'s evidence item out of the pack, and its tokens off the budget."""
    item = next(e for e in result.evidence if e.chunk_id == c.chunk_id)
    result.evidence.remove(item)
    result.tokens_used -= item.tokens


def _whole_sentences_within(text: str, budget: int, count_tokens: TokenCounter) -> tuple[str, int]:
    """The longest prefix of whole sentences that fits the budget ("" if none does). Once the
    budget is nearly spent, most chunks cannot fit even their first sentence: that is checked
    on the sentence alone. Otherwise the text is tokenized once for all its sentence ends (a
    tokenizer call per prefix made packing a tenth of the whole search)."""
    if budget <= 0:  # the budget is spent: most of a long result list ends here, unread
        return "", 0
    # Once the budget is nearly spent, most chunks cannot fit even their first sentence, and
    # no tokenizer is needed to say so: every word with a letter or digit in it is at least
    # one token, so a first sentence of more such words than the budget cannot fit.
    first = first_sentence_end(text)
    if first is None or _more_words(text, first, budget) or count_tokens(text[:first]) > budget:
        return "", 0
    ends = [end for _, end in sentence_spans(text, 0, len(text))]
    best, best_tokens = "", 0
    for end, tokens in zip(ends, count_tokens.prefix_counts(text, ends), strict=True):
        if tokens > budget:
            break
        best, best_tokens = text[:end], tokens
    return best, best_tokens


# A whitespace-separated word with a letter, digit or underscore in it: at least one token.
_WORD = re.compile(r"[^\s\w]*\w\S*")


def _more_words(text: str, end: int, than: int) -> bool:
    """Whether ``text[:end]`` holds more than ``than`` such words (reading no further than
    the one past ``than``)."""
    return sum(1 for _ in islice(_WORD.finditer(text, 0, end), than + 1)) > than
