"""each chunk keeps the title of its own version

The relay built a chunk's Elasticsearch copy with the document's *current* title and
metadata. While a new version is pending (or after its job failed), the current ones belong to
that newer version, so the previous version's chunks were copied with a title they were never
written with, and their fingerprint (taken at write time) could never match the copy:
reconcile reported them stale on every run. Chunks already keep their version's metadata;
``chunks.title`` keeps its title, and the copy is built from the chunk alone.

Existing rows take their document's current title, the one 0008's fingerprints used.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("title", sa.Text(), nullable=False, server_default=""))
    op.execute(
        "UPDATE chunks SET title = documents.title FROM documents "
        "WHERE documents.id = chunks.document_id AND documents.title <> ''"
    )


def downgrade() -> None:
    op.drop_column("chunks", "title")
