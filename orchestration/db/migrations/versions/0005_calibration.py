"""Calibration: learned factors, their history, per-step timings and each job's estimate-vs-actual.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "calibration_factors",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", "key", name=op.f("pk_calibration_factors")),
    )
    op.create_table(
        "calibration_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("old", sa.Double(), nullable=True),
        sa.Column("new", sa.Double(), nullable=False),
        sa.Column("observed", sa.Double(), nullable=False),
        sa.Column("residual", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_calibration_history_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_history")),
    )
    with op.batch_alter_table("calibration_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_calibration_history_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_calibration_history_job_id"), ["job_id"], unique=False)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("accuracy", sa.JSON(), nullable=True))
    with op.batch_alter_table("task_metrics") as batch:
        batch.add_column(sa.Column("timings", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_metrics") as batch:
        batch.drop_column("timings")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("accuracy")
    with op.batch_alter_table("calibration_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calibration_history_job_id"))
        batch_op.drop_index(batch_op.f("ix_calibration_history_at"))
    op.drop_table("calibration_history")
    op.drop_table("calibration_factors")
