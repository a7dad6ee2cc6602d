"""Fuse: the dense and lexical candidate lists as one ranking (then lifted by a metadata
boost, and capped per document for a paginated search).

* Weighted reciprocal rank fusion: ``sum(w_arm / (k + rank_arm))``; uses ranks only.
* Convex combination: each arm's scores normalized (min-max or z-score) and combined as
  ``alpha * dense + (1 - alpha) * lexical``; a candidate an arm did not return gets that arm's
  lowest normalized score.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime

from shared.search.boost import boosted
from shared.search.caps import within_cap
from shared.search.lifts import document_lifts, lift_documents, liftable
from shared.search.passages import (
    PassageMatch,
    Question,
    best_arm_places,
    competing,
    exact_names,
    reorder_within_documents,
)
from shared.search.schemas import Fusion
from shared.search.values import NOTHING_READ_AHEAD, Arms, Query, ReadAhead, Retrieved
from shared.stores.ports import VectorSearch
from shared.stores.schemas import ArmHit, ChunkText, document_of_chunk
from shared.timing import StageTimes


def rrf(
    arms: dict[str, list[ArmHit]], k: int, weights: dict[str, float] | None = None
) -> list[tuple[str, float]]:
    scores: dict[str, float] = {}
    for arm, hits in arms.items():
        weight = (weights or {}).get(arm, 1.0)
        for hit in hits:
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + weight / (k + hit.rank)
    return _ordered(scores)


def normalize(scores: list[float], method: str) -> list[float]:
    if not scores:
        return []
    if method == "zscore":
        mean = statistics.fmean(scores)
        spread = statistics.pstdev(scores)
        return [(s - mean) / spread if spread else 0.0 for s in scores]
    low, high = min(scores), max(scores)
    return [(s - low) / (high - low) if high > low else 1.0 for s in scores]


def convex(arms: dict[str, list[ArmHit]], alpha: float, method: str) -> list[tuple[str, float]]:
    normalized: dict[str, dict[str, float]] = {}
    for arm, hits in arms.items():
        values = normalize([h.score for h in hits], method)
        normalized[arm] = {h.chunk_id: v for h, v in zip(hits, values, strict=True)}
    floor = {arm: min(values.values(), default=0.0) for arm, values in normalized.items()}
    weight = {"dense": alpha, "lexical": 1.0 - alpha}
    candidates = {cid for values in normalized.values() for cid in values}
    scores = {
        cid: sum(weight[arm] * normalized[arm].get(cid, floor[arm]) for arm in normalized)
        for cid in candidates
    }
    return _ordered(scores)


def fuse(arms: dict[str, list[ArmHit]], options: Fusion) -> list[tuple[str, float]]:
    if options.method == "convex":
        return convex(arms, options.alpha, options.normalization)
    return rrf(arms, options.k, arm_weights(options))


def arm_weights(options: Fusion) -> dict[str, float]:
    """How much the fusion weighs each arm (RRF's weights, or convex's alpha and its rest)."""
    if options.method == "convex":
        return {"dense": options.alpha, "lexical": 1.0 - options.alpha}
    return {str(arm): w for arm, w in options.weights.items()}


def _ordered(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def fused_ranking(
    query: Query, arms: Arms, *, vectors: VectorSearch, timings: StageTimes
) -> Retrieved:
    """The arms' hits fused as the request asks, lifted by its boost (the values read from
    Postgres for every fused candidate, in one query), the first candidates' chunks ordered
    within their documents by how exactly they answer (passages.py), then, without a boost,
    the documents whose title names the question's subject or whose chunks write its exact
    names lifted (lifts.py); the stage hydrates its candidates in one read, which the first
    page's hydration takes over (:func:`read_ahead`). For a paginated search, capped per
    document once, so that the cap holds across pages. Every page of a cursor follows this
    one ranking."""
    request = query.request
    fused = timings.timed("fuse", lambda: fuse(arms.hits, request.fusion))
    boost = request.boost
    if boost is not None:
        with timings.stage("boost"):
            values = vectors.metadata_values(
                query.tenant_id, [cid for cid, _ in fused], boost.field
            )
            fused = boosted(fused, values, boost, datetime.now(UTC))
    window = query.settings.search_passage_window
    ahead = NOTHING_READ_AHEAD
    if window and len(fused) > 1:
        with timings.stage("passages"):
            candidates = [cid for cid, _ in passage_window(fused, arms, window)]
            # A request's boost has the last word on the order of documents. Titles weigh the
            # question's terms by the corpus's counts (retrieve reads them for every search):
            # where Elasticsearch could not count them, no title is lifted (lifts.liftable).
            settings = query.settings
            title_lift = settings.search_title_lift if liftable(arms.counts) else 0.0
            name_lift = settings.search_name_lift if exact_names(request.query) else 0.0
            lifting = boost is None and bool(title_lift or name_lift)
            competing_ids = competing(candidates)
            if competing_ids or lifting:
                # Every candidate is read, the arms' leaders past the window too (the stage
                # may move one of those into it), and hydrated whole: the first page's
                # results are among them, and its hydration reads none of them again.
                ahead = read_ahead(query, arms, candidates, vectors=vectors)
                texts = {
                    cid: ChunkText(row.text, row.section, row.title)
                    for cid, row in ahead.rows.items()
                }
                question = Question.of(request.query, arms.counts)
                matches = passage_matches(query, question, texts, competing_ids, arms=arms)
                fused = reorder_within_documents(fused, matches)
                if lifting:
                    lifts = document_lifts(
                        question, arms.counts, texts, title_lift=title_lift, name_lift=name_lift
                    )
                    fused = lift_documents(fused, lifts, window=window)
    if request.paginate and request.per_document_cap is not None:
        fused = within_cap(fused, request.per_document_cap, lambda hit: document_of_chunk(hit[0]))
    return Retrieved(arms.hits, arms.degraded, arms.vector, fused, arms.counts, ahead)


# Each arm's first hits join the passages' window wherever fusion put them: a chunk one arm
# ranks first and the other does not find at all (an exact name only BM25 matches, a
# paraphrase only the encoder understands) falls behind every chunk both arms rank
# moderately, 30th on a long changelog whose every chunk both arms return.
ARM_LEADERS = 3


def passage_window(
    fused: list[tuple[str, float]], arms: Arms, window: int
) -> list[tuple[str, float]]:
    """The first ``window`` fused candidates, and each arm's first ``ARM_LEADERS`` hits."""
    first = fused[:window]
    inside = {cid for cid, _ in first}
    leaders = {h.chunk_id for hits in arms.hits.values() for h in hits[:ARM_LEADERS]} - inside
    return first + [hit for hit in fused[window:] if hit[0] in leaders]


def read_ahead(query: Query, arms: Arms, ids: list[str], *, vectors: VectorSearch) -> ReadAhead:
    """The live chunks among ``ids`` hydrated in one read, with their embeddings (Postgres
    computes a cosine only where some chunk lacks the dense arm's): the passages stage reads
    its candidates' texts this way, and the first page's hydration reads none of them again
    (a round trip to Postgres a search fewer)."""
    dense = {hit.chunk_id for hit in arms.hits.get("dense", [])}
    vector = None if all(cid in dense for cid in ids) else arms.vector
    return ReadAhead(frozenset(ids), vectors.hydrate(query.tenant_id, ids, vector, ids))


def passage_matches(
    query: Query,
    question: Question,
    texts: dict[str, ChunkText],
    competing_ids: list[str],
    *,
    arms: Arms,
) -> dict[str, PassageMatch]:
    """How each of the candidates that compete with another chunk of their document
    (:func:`passages.competing`) answers ``question`` (one ``texts`` lacks, no longer held,
    is left out and keeps its place)."""
    arm_places = best_arm_places(arms.hits, arm_weights(query.request.fusion))
    return {
        cid: question.match(texts[cid].text, texts[cid].section).with_arm_place(arm_places.get(cid))
        for cid in competing_ids
        if cid in texts
    }
