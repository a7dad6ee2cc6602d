"""Bucketing and fingerprints shared by both stores.

Every chunk id falls in one of ``BUCKETS`` buckets; both stores keep the bucket with the chunk
(Postgres column, Elasticsearch field). Per bucket, each side reports (count, sum of versions,
sum of content-hash numbers): order-independent, so a bucket that agrees needs no more reading,
and only the buckets that differ are compared chunk by chunk.
"""

from __future__ import annotations

import hashlib

BUCKETS = 1024

# SQL twins of the functions below (the migration and the reconcile repository use them).
SQL_HASH_NUM = "('x' || substr({column}, 1, 8))::bit(32)::bigint"


def bucket_of(chunk_id: str) -> int:
    return int(hashlib.sha256(chunk_id.encode()).hexdigest()[:8], 16) % BUCKETS


def hash_num(text_hash: str) -> int:
    """The first 32 bits of the content hash: summable in Elasticsearch without precision
    loss (sums stay far below 2^53)."""
    return int(text_hash[:8], 16)
