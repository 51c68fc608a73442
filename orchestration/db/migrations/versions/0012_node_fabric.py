"""Node fabric: a node's own port into its cluster's fabric, as its agent declares it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("fabric_bandwidth_gbps", sa.Double(), nullable=True))
        batch.add_column(sa.Column("fabric_latency_ms", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("fabric_latency_ms")
        batch.drop_column("fabric_bandwidth_gbps")
