"""Workers' log lines per task (bounded and rotated per task, pruned after their job ends).

Revision ID: 0018
Revises: 0016
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_logs",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stream", sa.String(length=16), nullable=False),
        sa.Column("line", sa.String(length=4000), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_task_logs")),
    )
    with op.batch_alter_table("task_logs") as batch:
        batch.create_index("ix_task_logs_job_seq", ["job_id", "seq"], unique=False)
        batch.create_index("ix_task_logs_task_seq", ["task_id", "seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("task_logs") as batch:
        batch.drop_index("ix_task_logs_task_seq")
        batch.drop_index("ix_task_logs_job_seq")
    op.drop_table("task_logs")
