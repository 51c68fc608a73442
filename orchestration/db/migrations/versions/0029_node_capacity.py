"""A scheduler-backed node's devices unavailable now (its cluster's own users hold them) and
the queue wait its agent expects for a task submitted now.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, as 0022: a batch copy of ``nodes`` fails on SQLite with rows there.
    op.add_column("nodes", sa.Column("devices_unavailable", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("nodes", sa.Column("queue_wait_s", sa.Double(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("nodes", "queue_wait_s")
    op.drop_column("nodes", "devices_unavailable")
