"""Enrollment tokens are issued for one provider.

Tokens issued before this revision belonged to no provider; they are given the default provider
("independent"), so they keep enrolling nodes that declare none.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.add_column(
            sa.Column("provider", sa.String(length=128), nullable=False, server_default="independent")
        )
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.alter_column("provider", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.drop_column("provider")
