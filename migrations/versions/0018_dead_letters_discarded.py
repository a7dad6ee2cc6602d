"""dead letters are discarded, not deleted

A discarded letter is hidden from the operator's lists and counts but kept, with the digest of
the content it refused: `concord sync` holds back a file whose same content was refused, and
deleting the letter made the next sync send it again, to be refused again under a new id.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "dead_letters", sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("dead_letters", "discarded_at")
