"""The audit log: who did what to what, when, and from where. Append-only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, utcnow


class AuditEvent(Base):
    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor_kind: Mapped[str] = mapped_column(String(16))  # tenant | node | system
    actor_id: Mapped[str] = mapped_column(String(64), index=True)
    action: Mapped[str] = mapped_column(String(64), index=True)  # e.g. token.created, price.changed
    target: Mapped[str] = mapped_column(String(128), default="")
    source: Mapped[str] = mapped_column(String(128), default="")  # client address
    details: Mapped[dict[str, Any]]
