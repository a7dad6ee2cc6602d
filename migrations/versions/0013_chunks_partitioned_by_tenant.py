"""chunks partitioned by tenant: a large tenant's vectors in a partition and HNSW graph of its own

``chunks`` becomes a table partitioned by LIST (tenant_id). Every existing row stays where it
is: the old table becomes the DEFAULT partition ``chunks_shared``, which holds the small
tenants and has no HNSW index (their dense search is an exact scan of their own rows through
the tenant index, faster than any graph at that size, and their ingest no longer pays for
graph inserts). A tenant that grows past ``CONCORD_TENANT_PARTITION_MIN_CHUNKS`` is moved to
a partition of its own, with an HNSW graph of its vectors alone, by the periodic placement
task or ``concord partitions place`` (shared/stores/partitions.py). Existing large tenants
move on the first placement run after this migration.

The primary key becomes (id, tenant_id): a partitioned table's unique keys must hold the
partition key; id first, so lookups by chunk id alone still use it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 15:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The indexes every partition has, created on the parent (attached where a partition already
# has a matching one).
_INDEXES = (
    "CREATE INDEX ix_chunks_tenant_document ON chunks (tenant_id, document_id)",
    "CREATE INDEX ix_chunks_tenant_bucket ON chunks (tenant_id, bucket)",
    "CREATE INDEX ix_chunks_metadata_gin ON chunks USING gin (metadata jsonb_path_ops)",
)


def upgrade() -> None:
    op.execute("ALTER TABLE chunks RENAME TO chunks_shared")
    op.execute("DROP INDEX ix_chunks_embedding_hnsw")
    for name in ("tenant_document", "tenant_bucket", "metadata_gin"):
        op.execute(f"ALTER INDEX ix_chunks_{name} RENAME TO chunks_shared_{name}")
    op.execute("ALTER TABLE chunks_shared DROP CONSTRAINT chunks_pkey")
    op.execute("ALTER TABLE chunks_shared DROP CONSTRAINT chunks_document_id_fkey")
    op.execute(
        "CREATE TABLE chunks (LIKE chunks_shared INCLUDING DEFAULTS) PARTITION BY LIST (tenant_id)"
    )
    op.execute("ALTER TABLE chunks ATTACH PARTITION chunks_shared DEFAULT")
    op.execute("ALTER TABLE chunks ADD CONSTRAINT chunks_pkey PRIMARY KEY (id, tenant_id)")
    op.execute(
        "ALTER TABLE chunks ADD CONSTRAINT chunks_document_id_fkey FOREIGN KEY (document_id) "
        "REFERENCES documents (id) ON DELETE CASCADE"
    )
    for statement in _INDEXES:
        op.execute(statement)


def downgrade() -> None:
    """Back to one plain table holding every partition's rows, with the shared HNSW graph."""
    op.execute("CREATE TABLE chunks_plain (LIKE chunks INCLUDING DEFAULTS)")
    op.execute("INSERT INTO chunks_plain SELECT * FROM chunks")
    op.execute("DROP TABLE chunks CASCADE")  # the partitions with it
    op.execute("ALTER TABLE chunks_plain RENAME TO chunks")
    op.execute("ALTER TABLE chunks ADD CONSTRAINT chunks_pkey PRIMARY KEY (id)")
    op.execute(
        "ALTER TABLE chunks ADD CONSTRAINT chunks_document_id_fkey FOREIGN KEY (document_id) "
        "REFERENCES documents (id) ON DELETE CASCADE"
    )
    for statement in _INDEXES:
        op.execute(statement)
    op.execute(
        "CREATE INDEX ix_chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops)"
    )
