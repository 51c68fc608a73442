"""Workers' output lines, kept per task (bounded and rotated: ``orchestration.logs``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, utcnow

# 64-bit on PostgreSQL (lines are appended and rotated out for the life of the fleet); on SQLite
# only INTEGER PRIMARY KEY is the auto-assigned rowid, which is 64-bit there anyway.
SeqType = BigInteger().with_variant(Integer(), "sqlite")


class TaskLogLine(Base):
    """One line a task's workers wrote, or a marker (``dropped`` > 0) standing for lines not kept.

    ``seq`` orders a job's lines (every task's together) and is the cursor clients resume from.
    No foreign keys: an append takes no lock on the job or task rows, so a chatty worker never
    waits on (or deadlocks with) a status change; retention removes the lines of ended jobs.
    """

    __tablename__ = "task_logs"
    __table_args__ = (
        Index("ix_task_logs_job_seq", "job_id", "seq"),
        Index("ix_task_logs_task_seq", "task_id", "seq"),
    )

    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32))
    task_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)  # when the control plane got it
    stream: Mapped[str] = mapped_column(String(16))  # stdout | stderr | agent | cpn
    line: Mapped[str] = mapped_column(String(4000))
    bytes: Mapped[int] = mapped_column(Integer)  # UTF-8 length of line: what the byte bound counts
    dropped: Mapped[int] = mapped_column(Integer, default=0)  # > 0: a marker for this many lines
