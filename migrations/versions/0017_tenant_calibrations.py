"""per-tenant calibration of the default decision's dense-score threshold

One row per tenant (shared/search/calibration.py): the threshold set from its own corpus, with
the figures it was set from; a tenant without one keeps CONCORD_POLICY_MIN_SCORE.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenant_calibrations",
        sa.Column(
            "tenant_id",
            sa.String(64),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("min_score", sa.Float(), nullable=True),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("corpus_low", sa.Float(), nullable=False),
        sa.Column("background_high", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column(
            "computed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("tenant_calibrations")
