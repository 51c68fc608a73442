"""The admission queue: jobs wait as ``queued`` (stored ``pending`` rows are renamed) with a
priority and a queue position; tenants get quotas (devices in use, monthly spend).

Revision ID: 0015
Revises: 0018
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.add_column("jobs", sa.Column("queue_position", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("max_devices", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("max_monthly_spend", sa.Double(), nullable=True))
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'pending'")


def downgrade() -> None:
    op.execute("UPDATE jobs SET status = 'pending' WHERE status = 'queued'")
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy would drop tables that other rows reference.
    op.drop_column("tenants", "max_monthly_spend")
    op.drop_column("tenants", "max_devices")
    op.drop_column("jobs", "queue_position")
    op.drop_column("jobs", "priority")
