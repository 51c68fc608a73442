"""Artifacts: tenant-owned records of blobs in the artifact store; a per-tenant storage quota.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_artifacts_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
    )
    op.create_index("ix_artifacts_tenant_digest", "artifacts", ["tenant_id", "digest"])
    op.create_index("ix_artifacts_job_name", "artifacts", ["job_id", "name"])
    op.create_index("ix_artifacts_digest", "artifacts", ["digest"])
    op.create_index("ix_artifacts_expires_at", "artifacts", ["expires_at"])
    # Plain ADD COLUMN: a batch copy of ``tenants`` would drop a table others reference.
    op.add_column("tenants", sa.Column("max_artifact_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_index("ix_artifacts_expires_at", table_name="artifacts")
    op.drop_index("ix_artifacts_digest", table_name="artifacts")
    op.drop_index("ix_artifacts_job_name", table_name="artifacts")
    op.drop_index("ix_artifacts_tenant_digest", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_column("tenants", "max_artifact_bytes")
