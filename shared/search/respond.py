"""Respond: the page's results shaped as the request asks (highlights, per-result rank traces,
groups by document, a cursor for the next page), with the policy's decision and evidence."""

from __future__ import annotations

from shared.search import cursors
from shared.search.highlights import highlight, query_terms
from shared.search.schemas import (
    Copy,
    DocumentGroup,
    Evidence,
    RankScore,
    RerankTrace,
    SearchResponse,
    SearchResult,
    Trace,
)
from shared.search.values import (
    Candidate,
    PolicyResult,
    Query,
    Ranked,
    RerankInfo,
    Retrieved,
)
from shared.stores.ports import SnapshotStore
from shared.stores.schemas import ArmHit
from shared.timing import StageTimes

ByArm = dict[str, dict[str, ArmHit]]
FusedRank = dict[str, tuple[int, float]]


def respond(
    query: Query,
    retrieved: Retrieved,
    ranked: Ranked,
    *,
    policy: PolicyResult,
    dropped: int,
    timings: StageTimes,
    snapshots: SnapshotStore,
    offset: int = 0,
    cursor_id: str | None = None,
) -> SearchResponse:
    request = query.request
    by_arm = {arm: {h.chunk_id: h for h in hits} for arm, hits in retrieved.arms.items()}
    fused_rank = {cid: (rank, score) for rank, (cid, score) in enumerate(retrieved.fused, 1)}
    terms = query_terms(request.query) if request.highlight else frozenset()
    items = []
    for final_rank, c in enumerate(ranked.results, start=1):
        item = result(c, by_arm, fused_rank, mode=request.mode)
        if c.copies:
            item.copies = [_copy(o) for o in c.copies]
        if request.highlight:
            item.highlights = highlight(c.text, terms)
        if request.explain:
            item.trace = trace(
                c,
                final_rank,
                by_arm,
                fused_rank=fused_rank,
                rerank_info=ranked.rerank,
                policy=policy,
            )
        items.append(item)
    response = SearchResponse(
        query=request.query,
        mode=request.mode,
        degraded=[*retrieved.degraded, *ranked.degraded],
        dropped_stale=dropped,
        decision=policy.decision(),
        results=items,
        evidence=Evidence(
            items=policy.evidence,
            token_budget=policy.token_budget,
            tokens_used=policy.tokens_used,
            omitted=policy.omitted,
        ),
    )
    if request.group_by == "document":
        response.groups = group_by_document(items)
    if request.paginate:
        response.next_cursor = next_cursor(
            query,
            retrieved,
            ranked.results,
            snapshots=snapshots,
            offset=offset,
            cursor_id=cursor_id,
        )
    if request.explain:
        response.timings_ms = timings.totals
    return response


def _copy(other: Candidate) -> Copy:
    """A copy of a result's text in another document (the same page in two formats)."""
    return Copy(
        chunk_id=other.chunk_id,
        document_id=other.document_id,
        external_id=other.external_id,
        title=other.title,
        section=other.section,
    )


def next_cursor(
    query: Query,
    retrieved: Retrieved,
    results: list[Candidate],
    *,
    snapshots: SnapshotStore,
    offset: int,
    cursor_id: str | None,
) -> str | None:
    """Where the next page starts (past this page's last result), or None at the end; the
    ranking is stored with the first page's cursor, and later pages reuse it."""
    if len(results) < query.request.top_k:
        return None  # the ranking ran out (or the hydration budget did): nothing after this
    position = {cid: i for i, (cid, _) in enumerate(retrieved.fused)}
    following = max(position[c.chunk_id] for c in results) + 1
    if following >= len(retrieved.fused):
        return None
    if cursor_id is None:
        stored = cursors.Stored(query.request, query.calibrated_min_score, retrieved)
        cursor_id = cursors.save(snapshots, query.tenant_id, stored)
    return cursors.encode(cursor_id, following)


def group_by_document(results: list[SearchResult]) -> list[DocumentGroup]:
    """The results by document: documents in the order of their best result (the results are
    in rank order), each with its results in rank order."""
    groups: dict[str, DocumentGroup] = {}
    for r in results:
        group = groups.get(r.document_id)
        if group is None:
            group = groups[r.document_id] = DocumentGroup(
                document_id=r.document_id,
                external_id=r.external_id,
                title=r.title,
                score=r.score,
                results=[],
            )
        group.results.append(r)
    return list(groups.values())


def result(c: Candidate, by_arm: ByArm, fused_rank: FusedRank, *, mode: str) -> SearchResult:
    """The result of a candidate. Its ``score`` is the one its mode ranks by: the arm's own
    (the dense cosine, the BM25 score) in a single-arm mode, the fused score in hybrid."""
    own = by_arm.get(mode, {}).get(c.chunk_id) if mode != "hybrid" else None
    return SearchResult(
        chunk_id=c.chunk_id,
        document_id=c.document_id,
        external_id=c.external_id,
        title=c.title,
        version=c.version,
        section=c.section,
        text=c.text,
        char_start=c.char_start,
        char_end=c.char_end,
        indexed_at=c.indexed_at,
        score=round(own.score if own is not None else fused_rank[c.chunk_id][1], 6),
        found_by=[arm for arm in ("dense", "lexical") if c.chunk_id in by_arm.get(arm, {})],
        scores=c.scores,
        flags=list(c.flags),
    )


def trace(
    c: Candidate,
    final_rank: int,
    by_arm: ByArm,
    *,
    fused_rank: FusedRank,
    rerank_info: RerankInfo,
    policy: PolicyResult,
) -> Trace:
    def arm(name: str) -> RankScore | None:
        hit = by_arm.get(name, {}).get(c.chunk_id)
        return RankScore(rank=hit.rank, score=round(hit.score, 6)) if hit else None

    rank, score = fused_rank[c.chunk_id]
    rerank = rerank_info.get(c.chunk_id)
    return Trace(
        dense=arm("dense"),
        lexical=arm("lexical"),
        fused=RankScore(rank=rank, score=round(score, 6)),
        rerank=RerankTrace(score=round(rerank[0], 6), rank_change=rerank[1]) if rerank else None,
        final_rank=final_rank,
        policy=policy.per_result.get(c.chunk_id, "not_considered"),
    )
