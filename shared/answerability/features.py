"""What a query's own retrieval says about whether the index can answer it.

An unanswerable query still finds topically close passages with the same top cosine as an
answer (a threshold on it catches 0.19 of SciFact's unanswerable queries at 5 % false
abstains), so the features look at the *shape* of both arms' score lists and at whether the
two arms agree, not at one score: when the answer is in the index, dense and BM25 tend to
find the same document first and the top score stands out of the list (the post-retrieval
predictors NQC, WIG and the arms' agreement; see ../shared/notes/answerability.md).

A model trained with one of the tenant's rerankers (``concord answerability train --reranker``)
also reads that cross-encoder's scores of the first ``RERANK_WINDOW`` results in fused order
(:func:`rerank_features`): the shape features cannot tell a passage *about* the claim from one
that answers it; a cross-encoder trained on the tenant's judgements reads both texts.

The same function computes them at training time (from the arms with and without the
query's relevant documents) and at search time (from the arms the search already ran), so a
model never sees features computed any other way. Lists are read per document (a document's
best chunk), at most ``FEATURE_DEPTH`` deep: a search's default candidate depth.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from shared.stores.schemas import ArmHit

FEATURE_DEPTH = 50
TOP = 10  # the "top" of a list: the policy judges the first ten results by default

FEATURE_NAMES = (
    "dense_top1",  # the best cosine
    "dense_gap_1_2",  # best minus second-best document's cosine
    "dense_top1_minus_mean10",
    "dense_std10",
    "dense_mean10_minus_mean50",  # WIG-like: how far the top stands above the list
    "lexical_log_top1",  # log(1 + best BM25 score)
    "lexical_top1_over_mean10",
    "lexical_nqc",  # std of the top ten / mean of the list (NQC)
    "lexical_gap_1_2",  # relative: (s1 - s2) / s1
    "lexical_top1_per_term",  # best BM25 score per query word (term rarity, roughly)
    "arms_agree_top1",  # both arms' first document is the same one
    "arms_overlap10",  # share of the top ten documents both arms found
    "dense_rank_of_lexical_top1",  # 1 / rank (0 when the dense arm did not find it)
    "lexical_rank_of_dense_top1",
    "query_log_words",
)

# The reranker's scores (raw logits) of the first RERANK_WINDOW results in fused order.
RERANK_WINDOW = 10
RERANK_FEATURE_NAMES = (
    "rerank_top1",  # the best passage's score
    "rerank_of_fused_top1",  # the score of the fused ranking's first result
    "rerank_gap_1_2",  # best minus second-best score
    "rerank_mean3",  # mean of the three best
    "rerank_mean",  # mean and spread over the window
    "rerank_std",
)

_WORD = re.compile(r"\w+")


def per_document(
    hits: Sequence[ArmHit], document_of: Callable[[str], str]
) -> list[tuple[str, float]]:
    """(document, its best chunk's score), in the arm's order, at most FEATURE_DEPTH deep."""
    seen: dict[str, float] = {}
    for hit in hits:
        document = document_of(hit.chunk_id)
        if document not in seen:
            seen[document] = hit.score
            if len(seen) == FEATURE_DEPTH:
                break
    return list(seen.items())


def answerability_features(
    query: str,
    dense: list[tuple[str, float]],
    lexical: list[tuple[str, float]],
) -> np.ndarray:
    """The features (in FEATURE_NAMES order) from each arm's per-document list."""
    d = np.array([s for _, s in dense], dtype=np.float64)
    lex = np.array([s for _, s in lexical], dtype=np.float64)
    dense_docs = [doc for doc, _ in dense]
    lexical_docs = [doc for doc, _ in lexical]
    words = max(1, len(_WORD.findall(query)))
    d10, l10 = d[:TOP], lex[:TOP]
    features = [
        _at(d, 0, -1.0),
        _at(d, 0, 0.0) - _at(d, 1, _at(d, 0, 0.0)),
        _at(d, 0, 0.0) - _mean(d10),
        _std(d10),
        _mean(d10) - _mean(d),
        math.log1p(max(_at(lex, 0, 0.0), 0.0)),
        _at(lex, 0, 0.0) / _mean(l10) if _mean(l10) > 0 else 0.0,
        _std(l10) / _mean(lex) if _mean(lex) > 0 else 0.0,
        (_at(lex, 0, 0.0) - _at(lex, 1, 0.0)) / _at(lex, 0, 1.0) if _at(lex, 0, 0.0) > 0 else 0.0,
        _at(lex, 0, 0.0) / words,
        float(bool(dense_docs and lexical_docs and dense_docs[0] == lexical_docs[0])),
        len(set(dense_docs[:TOP]) & set(lexical_docs[:TOP])) / TOP,
        _inverse_rank(dense_docs, lexical_docs[0] if lexical_docs else None),
        _inverse_rank(lexical_docs, dense_docs[0] if dense_docs else None),
        math.log(words),
    ]
    return np.asarray(features, dtype=np.float64)


def rerank_features(scores: Sequence[float]) -> np.ndarray:
    """The features (in RERANK_FEATURE_NAMES order) from the reranker's scores of the first
    results in fused order (at most RERANK_WINDOW of them)."""
    window = np.asarray(list(scores)[:RERANK_WINDOW], dtype=np.float64)
    if not len(window):  # nothing retrieved: scores far below any passage's, no spread
        return np.asarray([-10.0, -10.0, 0.0, -10.0, -10.0, 0.0])
    best = np.sort(window)[::-1]
    return np.asarray(
        [
            best[0],
            window[0],
            best[0] - _at(best, 1, float(best[0])),
            float(best[:3].mean()),
            float(window.mean()),
            _std(window),
        ],
        dtype=np.float64,
    )


def _at(values: np.ndarray, i: int, default: float) -> float:
    return float(values[i]) if len(values) > i else default


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0


def _std(values: np.ndarray) -> float:
    return float(values.std()) if len(values) > 1 else 0.0


def _inverse_rank(documents: list[str], document: str | None) -> float:
    if document is None or document not in documents:
        return 0.0
    return 1.0 / (documents.index(document) + 1)
