"""Measured links: each node's probe endpoint and key, and the probes' bounded history.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("probe_port", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("probe_key", sa.String(length=64), nullable=False, server_default=""))
    op.create_table(
        "link_probes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("src_region", sa.String(length=64), nullable=False),
        sa.Column("dst_region", sa.String(length=64), nullable=False),
        sa.Column("src_node_id", sa.String(length=32), nullable=False),
        sa.Column("dst_node_id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("bulk_bytes", sa.Integer(), nullable=False),
        sa.Column("echoes", sa.Integer(), nullable=False),
        sa.Column("rtt_ms", sa.Double(), nullable=True),
        sa.Column("bandwidth_gbps", sa.Double(), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_link_probes")),
    )
    with op.batch_alter_table("link_probes") as batch:
        batch.create_index("ix_link_probes_pair", ["src_region", "dst_region", "requested_at"], unique=False)
        batch.create_index(batch.f("ix_link_probes_src_node_id"), ["src_node_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("link_probes") as batch:
        batch.drop_index(batch.f("ix_link_probes_src_node_id"))
        batch.drop_index("ix_link_probes_pair")
    op.drop_table("link_probes")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("probe_key")
        batch.drop_column("probe_port")
