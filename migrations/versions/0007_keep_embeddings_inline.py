"""keep chunk embeddings inline (storage MAIN)

A chunk row holds its text and its vector (1.5 KB at 384 dimensions); past about 2 KB Postgres
moves the largest out-of-line-able column to TOAST, and pgvector's default storage (EXTERNAL)
made that the vector. Every exact scan and every distance a query computed then read the TOAST
table as well: an exact scan of 10,000 chunks touched 19,800 buffers for 2,095 heap pages
(35 ms). With MAIN, Postgres moves the text out instead, which only hydration reads.

Rows written before this revision keep their layout until they are rewritten
(``VACUUM FULL chunks`` in a maintenance window, or re-ingesting); results are the same
either way, only faster.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 06:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE MAIN")


def downgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL")
