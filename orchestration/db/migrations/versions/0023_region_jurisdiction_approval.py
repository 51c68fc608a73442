"""Operator-approved jurisdictions: a region's jurisdiction is trusted only once an admin set it.

Until now the first agent to register a region set its jurisdiction, and data residency rested on
that claim. Claims already stored were never checked by anyone, so they stay claims: they are kept
(and shown) but not trusted until an admin approves them (``PUT /v1/regions/{name}/jurisdiction``).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch copy of ``regions`` would drop a table clusters and links reference.
    op.add_column(
        "regions", sa.Column("jurisdiction_approved", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    # Older code trusts every stored jurisdiction: a claim no admin approved must not gain that trust
    # on the way down, so it is dropped (the region's agents claim it again on registration).
    op.execute("UPDATE regions SET jurisdiction = '' WHERE jurisdiction_approved = false")
    op.drop_column("regions", "jurisdiction_approved")
