"""Preemption: the request a job's tasks are stopping on (reason, by whom, until when), and how
many times the job was preempted (its re-placements after a preemption are not retries).

Revision ID: 0019
Revises: 0017
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("preemption", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("preemptions", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of ``jobs`` would drop a table that tasks
    # and ledger rows reference.
    op.drop_column("jobs", "preemptions")
    op.drop_column("jobs", "preemption")
