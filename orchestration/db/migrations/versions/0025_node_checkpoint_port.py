"""Node checkpoint port: where a node serves checkpoint copies, over mutual TLS with each job's
credentials (they used to share the plaintext probe port).

Nodes registered before serve none until their agent registers again.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN: a batch copy of ``nodes`` would drop a table that accelerators and
    # tasks reference (SQLite refuses it with rows there).
    op.add_column("nodes", sa.Column("checkpoint_port", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("nodes", "checkpoint_port")
