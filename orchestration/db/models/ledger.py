"""The ledger: what each finished job actually cost, one line per task and charge kind."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, utcnow


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id"), default=None)
    attempt: Mapped[int] = mapped_column(default=0)
    region: Mapped[str] = mapped_column(String(64), default="")
    cluster_id: Mapped[str | None] = mapped_column(ForeignKey("clusters.id"), default=None)
    kind: Mapped[str] = mapped_column(String(16))  # gpu (device-hours) | egress (GB sent over the WAN)
    quantity: Mapped[float]
    unit_price: Mapped[float]
    amount: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
