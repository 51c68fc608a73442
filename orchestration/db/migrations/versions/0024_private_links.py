"""Private links: whether the providers declared a link private, for the gloo and NCCL traffic of
torchrun groups that span clusters (plaintext: it may cross only private links).

Links declared before say nothing, so they are public: a group across clusters is planned over one
only once an operator declares it private (``PUT /v1/links`` with ``private: true``).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("links") as batch:
        batch.add_column(sa.Column("private", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("links") as batch:
        batch.drop_column("private")
