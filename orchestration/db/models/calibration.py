"""Calibration state (one row per learned factor) and its history (one row per change)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, utcnow

KIND_LEN = 64  # the longest calibration kind's name, with room (migration 0014)


class CalibrationFactor(Base):
    """A learned factor: efficiency per "model|precision", startup_s per node, goodput per region pair."""

    __tablename__ = "calibration_factors"

    kind: Mapped[str] = mapped_column(String(KIND_LEN), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    value: Mapped[float]
    runs: Mapped[int] = mapped_column(default=0)  # finished runs that have moved it
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class CalibrationChange(Base):
    """How one finished job moved one factor, or (kind time/cost, key "job") how far its quote was off."""

    __tablename__ = "calibration_history"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(KIND_LEN))
    key: Mapped[str] = mapped_column(String(256))
    old: Mapped[float | None] = mapped_column(default=None)
    new: Mapped[float]
    observed: Mapped[float]
    residual: Mapped[float | None] = mapped_column(default=None)
