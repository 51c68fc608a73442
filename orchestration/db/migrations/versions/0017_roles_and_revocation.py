"""Roles on API keys, revocable enrollment tokens, an operator's cordon on nodes and the token
each node enrolled with.

Keys that predate roles keep what they could do: those of the platform tenant (``is_admin``)
become ``admin``, every other one ``tenant-admin``.

Revision ID: 0017
Revises: 0014
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("role", sa.String(length=16), nullable=False, server_default="tenant-admin")
        )
        batch.add_column(sa.Column("name", sa.String(length=64), nullable=False, server_default=""))
    op.execute(
        "UPDATE api_keys SET role = 'admin' WHERE tenant_id IN (SELECT id FROM tenants WHERE is_admin = true)"
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("role", server_default=None)
        batch.alter_column("name", server_default=None)
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.add_column(sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
    # Plain ALTERs on ``nodes``: SQLite's batch copy would drop a table that tasks reference.
    op.add_column("nodes", sa.Column("cordon", sa.String(length=16), nullable=False, server_default=""))
    op.add_column("nodes", sa.Column("enrollment_token_id", sa.String(length=32), nullable=True))
    if op.get_bind().dialect.name != "sqlite":  # SQLite keeps the default: it cannot alter one in place
        op.alter_column("nodes", "cordon", server_default=None)


def downgrade() -> None:
    # Nothing may gain power on the way down: older code reads every key of the platform tenant as
    # admin, so its narrower keys are revoked; a revoked token expires; a revoked node (its token
    # already cleared) reads as lost.
    op.execute(
        "UPDATE api_keys SET revoked_at = CURRENT_TIMESTAMP WHERE revoked_at IS NULL AND role <> 'admin'"
        " AND tenant_id IN (SELECT id FROM tenants WHERE is_admin = true)"
    )
    op.execute("UPDATE enrollment_tokens SET expires_at = revoked_at WHERE revoked_at IS NOT NULL")
    op.execute("UPDATE nodes SET status = 'lost' WHERE status = 'revoked'")
    op.drop_column("nodes", "enrollment_token_id")
    op.drop_column("nodes", "cordon")
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.drop_column("revoked_at")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("name")
        batch.drop_column("role")
