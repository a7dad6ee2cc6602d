"""fair claims over tenants, and a circuit breaker per webhook endpoint

Ingest claims and the outbox relay take work round-robin over tenants (each tenant's oldest
first): the tenants with work are found by a loose index scan, one probe per tenant, so each
needs an index that leads with the tenant (only queued jobs for ingest_jobs, which keeps
every job it ever ran).

A webhook endpoint counts its failed attempts in a row and, past
``webhook_breaker_failures``, is parked until ``parked_until``: its deliveries wait, nobody
else's do.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, table, columns, partial index condition)
INDEXES = [
    ("ix_ingest_jobs_queued_tenant", "ingest_jobs", "tenant_id, created_at", "WHERE state = 'queued'"),
    ("ix_es_outbox_tenant", "es_outbox", "tenant_id, id", ""),
]


def upgrade() -> None:
    op.add_column(
        "webhook_endpoints",
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "webhook_endpoints", sa.Column("parked_until", sa.DateTime(timezone=True), nullable=True)
    )
    # Built concurrently (as in 0015): claims and the relay go on meanwhile. An index a failed
    # build left behind (invalid) is dropped and built again.
    with op.get_context().autocommit_block():
        for name, table, columns, where in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {table} ({columns}) {where}")


def downgrade() -> None:
    op.drop_index("ix_es_outbox_tenant", table_name="es_outbox")
    op.drop_index("ix_ingest_jobs_queued_tenant", table_name="ingest_jobs")
    op.drop_column("webhook_endpoints", "parked_until")
    op.drop_column("webhook_endpoints", "consecutive_failures")
