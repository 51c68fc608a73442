"""Node staging: what staging costs on a node (its agent's probe) and what its cache holds.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, as 0022: a batch copy of ``nodes`` fails on SQLite with rows there.
    op.add_column("nodes", sa.Column("staging_probe", sa.JSON(), nullable=True))
    op.create_table(
        "node_cache",
        sa.Column("node_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_cache_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "kind", "digest", name=op.f("pk_node_cache")),
    )
    op.create_index("ix_node_cache_digest", "node_cache", ["digest"])


def downgrade() -> None:
    op.drop_index("ix_node_cache_digest", table_name="node_cache")
    op.drop_table("node_cache")
    op.drop_column("nodes", "staging_probe")
