"""Nodes keep the worker profile they measured at registration (start-up, teardown, cores, reference
step) and the CPU contention their heartbeats report.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("profile", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("cpu_contention", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("cpu_contention")
        batch.drop_column("profile")
