"""chunk first-sentence tokens: the evidence policy's test of what cannot fit, by its count

The evidence packer omits a result whose first sentence does not fit what is left of the
token budget. Once a few results are packed, that is most of a long result list, and it
found each one's first sentence and counted its tokens at search time (1.7 ms of a
100-result search). ``chunks.first_sentence_tokens`` holds the count from ingest. Existing
chunks get NULL and are judged as before, until their documents are uploaded again or
reembedded.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: Postgres adds the column to every partition without a rewrite.
    op.add_column("chunks", sa.Column("first_sentence_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("chunks", "first_sentence_tokens")
