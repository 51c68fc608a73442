"""GPU nodes: each accelerator's UUID and NVLink island, the node's last device samples, and the
reason a node is cordoned (a GPU health rule's, or "" for an operator's cordon).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, as 0022: a batch copy of ``nodes`` fails on SQLite with rows there.
    op.add_column("nodes", sa.Column("cordon_reason", sa.String(500), nullable=False, server_default=""))
    op.add_column("nodes", sa.Column("device_samples", sa.JSON(), nullable=True))
    op.add_column("accelerators", sa.Column("uuid", sa.String(64), nullable=False, server_default=""))
    op.add_column("accelerators", sa.Column("link_group", sa.Integer(), nullable=False, server_default="-1"))


def downgrade() -> None:
    op.drop_column("accelerators", "link_group")
    op.drop_column("accelerators", "uuid")
    op.drop_column("nodes", "device_samples")
    op.drop_column("nodes", "cordon_reason")
