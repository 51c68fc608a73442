"""Checkpoint copies: where each complete checkpoint of a job's participants has copies on other
nodes of its region, and the copy orders in flight.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_copies",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("participant", sa.String(length=200), nullable=False),
        sa.Column("dir", sa.String(length=400), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("source_node_id", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_checkpoint_copies_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_copies")),
    )
    with op.batch_alter_table("checkpoint_copies") as batch:
        batch.create_index(
            "ix_checkpoint_copies_job_participant", ["job_id", "participant", "step"], unique=False
        )
        batch.create_index(batch.f("ix_checkpoint_copies_node_id"), ["node_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_copies") as batch:
        batch.drop_index(batch.f("ix_checkpoint_copies_node_id"))
        batch.drop_index("ix_checkpoint_copies_job_participant")
    op.drop_table("checkpoint_copies")
