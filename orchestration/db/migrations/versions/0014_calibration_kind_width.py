"""Calibration kinds up to 64 characters: "checkpoint_fixed_s" and "exchange_drift_fixed_s" outgrew
the 16 that PostgreSQL enforces (SQLite never did).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("calibration_factors", "calibration_history")
WIDE, NARROW = sa.String(64), sa.String(16)


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("kind", type_=WIDE, existing_type=NARROW, existing_nullable=False)


def downgrade() -> None:
    # Rows of the longer kinds would not fit back: they are learned again from later runs.
    op.execute("DELETE FROM calibration_factors WHERE length(kind) > 16")
    op.execute("DELETE FROM calibration_history WHERE length(kind) > 16")
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("kind", type_=NARROW, existing_type=WIDE, existing_nullable=False)
