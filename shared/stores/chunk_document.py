"""The shape of a chunk's Elasticsearch copy: the one place it is built (the relay writes it,
reindex copies it, reconcile compares its fingerprint)."""

from __future__ import annotations

from typing import Any

from shared.models import Chunk, Document
from shared.stores import english_analysis
from shared.stores.buckets import bucket_of
from shared.stores.filters import range_terms


def es_document(chunk: Chunk, doc: Document) -> dict[str, Any]:
    """The Elasticsearch copy of ``chunk``: built from the chunk's own row (its version's
    title and metadata), so it matches the fingerprint taken when the chunk was written."""
    metadata = chunk.metadata_ or {}
    return {
        "chunk_id": chunk.id,
        "tenant_id": chunk.tenant_id,
        "document_id": str(chunk.document_id),
        "external_id": doc.external_id,
        "version": chunk.version,
        "ordinal": chunk.ordinal,
        "text_hash": chunk.text_hash,
        "title": chunk.title,
        "section": chunk.section,
        "text": chunk.text,
        # Pre-analyzed copies for the BM25 arm (see shared/stores/english_analysis.py). Both
        # families are written whichever analysis is configured: an index indexes one of them
        # (the one of the analysis it was made under), and searches fall back to it.
        "stemmed": {
            "title": english_analysis.analyze_repeated(chunk.title),
            "section": english_analysis.analyze_repeated(chunk.section),
            "text": english_analysis.analyze(chunk.text),
        },
        "metadata": metadata,
        "metadata_ranges": range_terms(metadata),
        "bucket": bucket_of(chunk.id),
        "fingerprint": chunk.fingerprint,
    }
