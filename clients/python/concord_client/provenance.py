"""A result's provenance as flat metadata, the same for every framework's document type."""

from __future__ import annotations

from typing import Any

from concord_client.models import SearchResponse, SearchResult


def result_metadata(result: SearchResult, response: SearchResponse, rank: int) -> dict[str, Any]:
    """Where a passage comes from and how it ranked, and the search's decision: a RAG
    application keeps the first to cite and reads the second before it answers (``verify``:
    check the passage; ``abstain``: the corpus does not say)."""
    return {
        "chunk_id": result.chunk_id,
        "document_id": result.document_id,
        "external_id": result.external_id,
        "title": result.title,
        "version": result.version,
        "section": result.section,
        "char_start": result.char_start,
        "char_end": result.char_end,
        "indexed_at": result.indexed_at,
        "rank": rank,
        "score": result.score,
        "scores": dict(result.scores),
        "found_by": list(result.found_by),
        "flags": list(result.flags or []),
        "decision": response.decision.status,
        "decision_reason": response.decision.reason,
    }
