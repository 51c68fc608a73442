"""A task's latest complete checkpoint (its step), as its agent last reported it, and whether it
was dropped from its attempt (lost in an elastic job: the others trained on without it).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("checkpoint_step", sa.Integer(), nullable=True))
    op.add_column("tasks", sa.Column("dropped", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("dropped")
        batch.drop_column("checkpoint_step")
