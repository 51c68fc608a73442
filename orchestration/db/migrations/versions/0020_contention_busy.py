"""Nodes keep, with their CPU contention figure, the slots the control plane knew busy on the host
when the figure's probes were taken; indexes to count them (a host's nodes, a device's holds).

Revision ID: 0020
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: nothing to copy, and a batch copy of ``nodes`` would drop a table that
    # accelerators and tasks reference.
    op.add_column("nodes", sa.Column("cpu_contention_busy", sa.Double(), nullable=True))
    op.create_index("ix_nodes_hostname", "nodes", ["hostname"])
    op.create_index("ix_allocations_accelerator_id", "allocations", ["accelerator_id"])


def downgrade() -> None:
    op.drop_index("ix_allocations_accelerator_id", table_name="allocations")
    op.drop_index("ix_nodes_hostname", table_name="nodes")
    op.drop_column("nodes", "cpu_contention_busy")
