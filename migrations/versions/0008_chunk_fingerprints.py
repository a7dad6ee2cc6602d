"""chunk fingerprints over the id and every copied field

Reconciliation summed a hash of the chunk text per bucket, so a missing chunk and an orphan of
the same version and text in one bucket cancelled out, and a copy with a wrong title, section
or metadata counted as current. ``chunks.fingerprint`` hashes the id and every field that
Elasticsearch copies (shared/stores/buckets.fingerprint); the relay writes the same number
into each copy.

Existing rows are backfilled here, page by page. Their Elasticsearch copies carry no
fingerprint yet, so the first reconcile after this revision finds every bucket differing and
rewrites the copies once (``concord admin reconcile --repair``, or the scheduled one).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from shared.stores.buckets import fingerprint

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PAGE = 5000


def upgrade() -> None:
    op.add_column(
        "chunks", sa.Column("fingerprint", sa.BigInteger(), nullable=False, server_default="0")
    )
    connection = op.get_bind()
    last_id = ""
    while True:
        rows = connection.execute(
            sa.text(
                "SELECT c.id, c.tenant_id, c.document_id, d.external_id, c.version, c.ordinal,"
                " c.text_hash, d.title, c.section, c.metadata"
                " FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE c.id > :last_id ORDER BY c.id LIMIT :page"
            ),
            {"last_id": last_id, "page": PAGE},
        ).all()
        if not rows:
            return
        connection.execute(
            sa.text("UPDATE chunks SET fingerprint = :fingerprint WHERE id = :id"),
            [
                {
                    "id": r.id,
                    "fingerprint": fingerprint(
                        chunk_id=r.id,
                        tenant_id=r.tenant_id,
                        document_id=str(r.document_id),
                        external_id=r.external_id,
                        version=r.version,
                        ordinal=r.ordinal,
                        text_hash=r.text_hash,
                        title=r.title,
                        section=r.section,
                        metadata=r.metadata or {},
                    ),
                }
                for r in rows
            ],
        )
        last_id = rows[-1].id


def downgrade() -> None:
    op.drop_column("chunks", "fingerprint")
