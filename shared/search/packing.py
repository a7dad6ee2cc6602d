"""Packing the evidence: the passages that answer, best first, into the token budget without
cutting sentences, at most a few chunks a document (a later chunk that answers better takes
the place of a weaker one), no near duplicates, text that reads like an instruction to a
language model flagged; every passage left out is named with its reason."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import islice

import numpy as np

from shared.ingest.chunking import first_sentence_end, sentence_spans
from shared.search.schemas import EvidenceItem, Provenance
from shared.search.values import Candidate, PolicyConfig, PolicyResult, TokenCounter

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


# How many candidates' embeddings to read at once when the packer reaches one without.
EMBEDDINGS_PER_READ = 16
# Copies of the candidates given, in their order, with the embeddings the store holds.
LoadEmbeddings = Callable[[list[Candidate]], list[Candidate]]


def pack(
    candidates: list[Candidate],
    config: PolicyConfig,
    count_tokens: TokenCounter,
    *,
    result: PolicyResult,
    load_embeddings: LoadEmbeddings | None,
) -> None:
    packed_by_document: dict[str, list[Candidate]] = {}
    packed_vectors: dict[str, np.ndarray] = {}
    packed: np.ndarray | None = None  # the same, as one matrix (stacked when one changes)
    loaded_before = 0  # candidates before this index have been offered to load_embeddings
    candidates = list(candidates)  # loaded copies take their originals' places in this one
    for i in range(len(candidates)):
        c = candidates[i]
        same_document = packed_by_document.setdefault(c.document_id, [])
        if len(same_document) >= config.max_chunks_per_document:
            # The cap keeps a document's chunks that answer best: a later one that matches
            # the question better than one packed takes its place (a man page's option
            # chunk over a third synopsis chunk of the same page).
            weakest = _weakest(same_document)
            if weakest is None or not _answers_better(c, weakest):
                result.omit(c, "per_document_cap")
                continue
            _unpack(result, weakest)
            same_document.remove(weakest)
            packed_vectors.pop(weakest.chunk_id, None)
            packed = np.stack(list(packed_vectors.values())) if packed_vectors else None
            result.omit(weakest, "per_document_cap")
        fitted = _fit(c, config.token_budget - result.tokens_used, count_tokens)
        if fitted is None:
            result.omit(c, "over_budget")
            continue
        text, tokens, truncated = fitted
        if c.embedding is None and packed is not None and i >= loaded_before and load_embeddings:
            candidates[i : i + EMBEDDINGS_PER_READ] = load_embeddings(
                candidates[i : i + EMBEDDINGS_PER_READ]
            )
            loaded_before, c = i + EMBEDDINGS_PER_READ, candidates[i]
        if (
            c.embedding is not None
            and packed is not None
            # one product with every packed vector at once (a Python loop over them was
            # most of the policy's time on a 100-result list)
            and float(np.max(packed @ c.embedding)) >= config.near_duplicate_threshold
        ):
            result.omit(c, "near_duplicate")
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
