"""ingest jobs count their lost attempts; lookups by document version and by chunk id indexed

``ingest_jobs.attempts_lost`` counts the attempts that ended with no outcome of the job's own:
its worker was lost while it ran (a kill, an OOM, the hard time limit: its lease ran out), or
its batch ran out of time. A batch holds many tenants' jobs, and such an end cannot say which
job caused it; a job that has lost two attempts runs alone from then on, so a document that
crashes its worker uses up its own attempts, not its batch-mates'.

``ingest_jobs`` is never pruned: the newest job of a document version (read on every upload
of a known external id, while its locks are held, and on every ``--wait`` poll) and the
cascade of a version's deletion were found by scanning it whole. Dead letters of the outbox
are looked up by chunk id in every reconcile range that drifts (refs of other sources can be
long external ids, so the index is partial).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 01:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "ingest_jobs",
        sa.Column("attempts_lost", sa.Integer(), nullable=False, server_default="0"),
    )
    # Built concurrently, outside the migration's transaction: ingest_jobs may be large, and a
    # plain build would block claims and lease renewals (and so expire live workers' leases)
    # until it ends. A build cut short leaves an invalid index: drop it, run this again.
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_ingest_jobs_document_version",
            "ingest_jobs",
            ["document_id", "version", "created_at"],
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.create_index(
            "ix_dead_letters_outbox_ref",
            "dead_letters",
            ["ref"],
            postgresql_where=sa.text("source = 'outbox'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_dead_letters_outbox_ref", table_name="dead_letters")
    op.drop_index("ix_ingest_jobs_document_version", table_name="ingest_jobs")
    op.drop_column("ingest_jobs", "attempts_lost")
