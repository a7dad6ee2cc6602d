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

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# (name, table, columns, partial index condition)
INDEXES = [
    ("ix_ingest_jobs_document_version", "ingest_jobs", "document_id, version, created_at", ""),
    ("ix_dead_letters_outbox_ref", "dead_letters", "ref", "WHERE source = 'outbox'"),
]


def upgrade() -> None:
    # Re-runnable: the index builds below commit what came before them, and this revision is
    # recorded only after them, so a build that failed leaves the column in place.
    op.execute(
        "ALTER TABLE ingest_jobs ADD COLUMN IF NOT EXISTS attempts_lost integer NOT NULL DEFAULT 0"
    )
    # Built concurrently, outside the migration's transaction: ingest_jobs may be large, and a
    # plain build would block claims and lease renewals (and so expire live workers' leases)
    # until it ends. An index a failed build left behind (invalid) is dropped and built again.
    with op.get_context().autocommit_block():
        for name, table, columns, where in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {table} ({columns}) {where}")


def downgrade() -> None:
    op.drop_index("ix_dead_letters_outbox_ref", table_name="dead_letters")
    op.drop_index("ix_ingest_jobs_document_version", table_name="ingest_jobs")
    op.drop_column("ingest_jobs", "attempts_lost")
