"""reconciliation buckets and runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 22:34:05.708705
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('reconcile_runs',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('tenant_id', sa.String(length=64), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('repair', sa.Boolean(), nullable=False),
    sa.Column('report', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_reconcile_runs_started', 'reconcile_runs', ['started_at'], unique=False)
    op.add_column('chunks', sa.Column('bucket', sa.SmallInteger(), server_default='0', nullable=False))
    # The same function as shared.stores.buckets.bucket_of (sha256 of the chunk id).
    op.execute(
        "UPDATE chunks SET bucket = (('x' || substr(encode(sha256(convert_to(id, 'UTF8')), "
        "'hex'), 1, 8))::bit(32)::bigint % 1024)"
    )
    op.create_index('ix_chunks_tenant_bucket', 'chunks', ['tenant_id', 'bucket'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_chunks_tenant_bucket', table_name='chunks')
    op.drop_column('chunks', 'bucket')
    op.drop_index('ix_reconcile_runs_started', table_name='reconcile_runs')
    op.drop_table('reconcile_runs')
