"""Node sandbox: whether and how a node runs users' code, as its agent registered.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nodes registered before it said nothing: they run no users' code until they register again.
    # Plain ADD/DROP COLUMN: a batch copy of ``nodes`` would drop a table that accelerators and
    # tasks reference (SQLite refuses it with rows there).
    op.add_column("nodes", sa.Column("sandbox", sa.String(32), nullable=False, server_default="none"))


def downgrade() -> None:
    op.drop_column("nodes", "sandbox")
