"""chunk metadata for filtered search

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 22:11:31.459357
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('chunks', sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False))
    op.execute("UPDATE chunks c SET metadata = d.metadata FROM documents d WHERE d.id = c.document_id")
    op.create_index('ix_chunks_metadata_gin', 'chunks', ['metadata'], unique=False, postgresql_using='gin', postgresql_ops={'metadata': 'jsonb_path_ops'})


def downgrade() -> None:
    op.drop_index('ix_chunks_metadata_gin', table_name='chunks', postgresql_using='gin', postgresql_ops={'metadata': 'jsonb_path_ops'})
    op.drop_column('chunks', 'metadata')
