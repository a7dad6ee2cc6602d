"""The evidence policy: decide whether the results can answer the query, and pack the evidence.

Thresholds apply only to a declared score type (dense cosine, or the rerank score), never to
fused ranks. The decision is ``answerable`` or ``abstain`` with a reason. Evidence is packed
into a token budget without cutting sentences, with a per-document cap and near-duplicate
suppression, and every omission is reported with its reason. Text that reads like an
instruction to a language model is flagged, never acted on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal, Protocol

import numpy as np

from shared.ingest.chunking import first_sentence_end, sentence_spans
from shared.search.schemas import Decision, EvidenceItem, Omission, Provenance

ScoreType = Literal["dense_cosine", "rerank"]


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


def looks_like_prompt_injection(text: str) -> bool:
    return bool(_INJECTION.search(text))


@dataclass(frozen=True)
class PolicyConfig:
    score_type: ScoreType
    min_score: float
    token_budget: int
    max_chunks_per_document: int
    near_duplicate_threshold: float


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


@dataclass
class PolicyResult:
    status: Literal["answerable", "abstain"]
    reason: str | None
    score_type: ScoreType
    threshold: float
    top_score: float | None
    evidence: list[EvidenceItem] = field(default_factory=list)
    omitted: list[Omission] = field(default_factory=list)
    tokens_used: int = 0
    token_budget: int = 0
    per_result: dict[str, str] = field(default_factory=dict)

    def decision(self) -> Decision:
        return Decision(
            status=self.status,
            reason=self.reason,
            score_type=self.score_type,
            threshold=self.threshold,
            top_score=self.top_score,
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
) -> PolicyResult:
    result = PolicyResult(
        "abstain", None, config.score_type, config.min_score, None, token_budget=config.token_budget
    )
    if not candidates:
        result.reason = "all_filtered" if dropped_before else "no_hits"
        return result

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
    if not scored:
        reasons = set(result.per_result.values())
        result.reason = next(
            r
            for r in ("below_threshold", "score_unavailable", "missing_provenance")
            if r in reasons
        )
        return result

    _pack(scored, config, count_tokens, result)
    if result.evidence:
        result.status = "answerable"
    else:
        result.reason = "over_budget"
    return result


def _omit(result: PolicyResult, c: Candidate, reason: str) -> None:
    result.omitted.append(Omission(chunk_id=c.chunk_id, reason=reason))
    result.per_result[c.chunk_id] = reason


def _pack(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    result: PolicyResult,
) -> None:
    per_document: dict[str, int] = {}
    packed_vectors: list[np.ndarray] = []
    packed: np.ndarray | None = None  # the same, as one matrix (stacked when one is added)
    for c in candidates:
        if per_document.get(c.document_id, 0) >= config.max_chunks_per_document:
            _omit(result, c, "per_document_cap")
            continue
        if (
            c.embedding is not None
            and packed is not None
            # one product with every packed vector at once (a Python loop over them was
            # most of the policy's time on a 100-result list)
            and float(np.max(packed @ c.embedding)) >= config.near_duplicate_threshold
        ):
            _omit(result, c, "near_duplicate")
            continue
        remaining = config.token_budget - result.tokens_used
        text, start, end = c.text, c.char_start or 0, c.char_end or 0
        tokens = c.token_count or count_tokens(text)  # 0: a row from before counts
        truncated = False
        if tokens > remaining:
            text, tokens = _whole_sentences_within(text, remaining, count_tokens)
            if not text:
                _omit(result, c, "over_budget")
                continue
            end = start + len(text)
            truncated = True
        result.tokens_used += tokens
        per_document[c.document_id] = per_document.get(c.document_id, 0) + 1
        if c.embedding is not None:
            packed_vectors.append(c.embedding)
            packed = np.stack(packed_vectors)
        flags = ["possible_prompt_injection"] if looks_like_prompt_injection(text) else []
        result.per_result[c.chunk_id] = "included_truncated" if truncated else "included"
        result.evidence.append(
            EvidenceItem(
                chunk_id=c.chunk_id,
                text=text,
                tokens=tokens,
                truncated=truncated,
                flags=flags,
                score=c.scores.get(config.score_type),
                provenance=Provenance(
                    document_id=c.document_id,
                    external_id=c.external_id,
                    version=c.version,
                    section=c.section,
                    char_start=start,
                    char_end=end,
                    indexed_at=c.indexed_at,
                ),
            )
        )


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
