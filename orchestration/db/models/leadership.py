"""The leader lease: one row per singleton group, the fence every write of its leader checks."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base


class LeaderLease(Base):
    """Who leads ``name`` (``holder``, empty once released), under which fencing token (``epoch``,
    +1 at every change of leader), and a counter the leader bumps to show it is alive (``beat``)."""

    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int]
    beat: Mapped[int] = mapped_column(default=0)
    holder: Mapped[str] = mapped_column(String(256), default="")
