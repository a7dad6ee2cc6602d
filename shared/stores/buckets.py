"""Bucketing and fingerprints shared by both stores.

Every chunk id falls in one of ``BUCKETS`` buckets; both stores keep the bucket with the chunk
(Postgres column, Elasticsearch field). Per bucket, each side reports (count, sum of versions,
sum of fingerprints): order-independent, so a bucket that agrees needs no more reading, and
only the buckets that differ are compared chunk by chunk.

A chunk's fingerprint covers its id and every field Elasticsearch holds a copy of (tenant,
document, version, ordinal, text hash, title, section, metadata). Without the id, a missing
chunk and an orphan of the same version and text in one bucket would cancel out in the sums;
without the copied fields, a copy with a wrong title or metadata would count as current.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.stores.schemas import BucketStats

BUCKETS = 1024


def bucket_of(chunk_id: str) -> int:
    return int(hashlib.sha256(chunk_id.encode()).hexdigest()[:8], 16) % BUCKETS


def fingerprint(
    *,
    chunk_id: str,
    tenant_id: str,
    document_id: str,
    external_id: str,
    version: int,
    ordinal: int,
    text_hash: str,
    title: str,
    section: str,
    metadata: dict[str, Any],
) -> int:
    """The first 32 bits of a hash of the chunk's copied fields: summable in Elasticsearch
    without precision loss (a bucket's sum stays far below 2^53)."""
    canonical = json.dumps(
        [
            chunk_id,
            tenant_id,
            document_id,
            external_id,
            version,
            ordinal,
            text_hash,
            title,
            section,
            metadata,
        ],
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return int(hashlib.sha256(canonical.encode()).hexdigest()[:8], 16)


def fingerprint_of_source(chunk_id: str, source: dict[str, Any]) -> int:
    """The fingerprint of an Elasticsearch copy, recomputed from its fields (not its stored
    ``fingerprint``), so a copy edited out of band does not vouch for itself."""
    return fingerprint(
        chunk_id=chunk_id,
        tenant_id=source.get("tenant_id", ""),
        document_id=source.get("document_id", ""),
        external_id=source.get("external_id", ""),
        version=int(source.get("version", 0)),
        ordinal=int(source.get("ordinal", 0)),
        text_hash=source.get("text_hash", ""),
        title=source.get("title", ""),
        section=source.get("section", ""),
        metadata=source.get("metadata") or {},
    )


def bucket_sums(rows: Iterable[tuple[str, int, int]]) -> BucketStats:
    """Per-bucket (count, sum of versions, sum of fingerprints) of (chunk id, version,
    fingerprint) rows, as both stores report them."""
    stats: dict[int, tuple[int, int, int]] = {}
    for chunk_id, version, print_ in rows:
        n, v, h = stats.get(bucket_of(chunk_id), (0, 0, 0))
        stats[bucket_of(chunk_id)] = (n + 1, v + version, h + print_)
    return stats
