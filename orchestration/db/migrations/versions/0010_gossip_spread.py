"""Gossip's spread per reported step (the largest distance of a region from the regions' mean at
the latest check), so the job page can draw it over time.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("task_metrics", sa.Column("gossip_spread", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_metrics") as batch:
        batch.drop_column("gossip_spread")
