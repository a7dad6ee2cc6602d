"""chunk flags: what parsing noticed about a chunk's text

A chunk from a PDF page with little or no text layer (a scan, a figure) is evidence to check
before use: ``chunks.flags`` carries ``doubtful_extraction`` for it, and the evidence policy
answers ``verify`` when such a chunk is the top evidence. Existing chunks get no flags (their
documents are flagged when next uploaded or reindexed).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: Postgres adds the column without rewriting the table.
    op.add_column(
        "chunks",
        sa.Column(
            "flags",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
    )


def downgrade() -> None:
    op.drop_column("chunks", "flags")
