"""The ``task_logs`` table: append a batch, rotate a task down to its bounds, read a job's lines,
prune the lines of long-ended jobs. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.orm import Session

from orchestration.db.models import Job, Task, TaskLogLine
from orchestration.logs.rotation import MARKER_STREAM, LogBounds, rotated_marker, rotation_cut

T = TaskLogLine.__table__
MAX_LINE_CHARS = 4000  # the column's width; agents send at most this much of a line
MAX_STREAM_CHARS = 16


def logs_channel(job_id: str) -> str:
    """The bus channel told (after commit) that a job has new lines; under ``job.*`` so the
    service layer's one fan-out subscription carries it."""
    return f"job.{job_id}.logs"


@dataclass(frozen=True)
class NewLine:
    """A line to append, cut to the column's width (``new_line`` builds it)."""

    job_id: str
    task_id: str
    stream: str
    line: str
    nbytes: int  # UTF-8 length of ``line``: what the byte bound counts
    created_at: datetime
    dropped: int = 0  # > 0: a marker standing for that many lines not kept

    @property
    def row(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "task_id": self.task_id,
            "stream": self.stream,
            "line": self.line,
            "bytes": self.nbytes,
            "dropped": self.dropped,
            "created_at": self.created_at,
        }


def new_line(
    job_id: str, task_id: str, stream: str, line: str, created_at: datetime, dropped: int = 0
) -> NewLine:
    line = line[:MAX_LINE_CHARS]
    return NewLine(
        job_id,
        task_id,
        stream[:MAX_STREAM_CHARS],
        line,
        len(line.encode("utf-8", "replace")),
        created_at,
        dropped,
    )


@dataclass(frozen=True)
class LogRow:
    seq: int
    task_id: str
    region: str
    created_at: datetime
    stream: str
    line: str
    dropped: int


def append(session: Session, lines: Sequence[NewLine]) -> None:
    """Insert ``lines`` as one batch (psycopg pipelines it). Nothing is RETURNed: returning each
    seq makes SQLAlchemy send multi-row statements it must parse back, 3-4x slower."""
    if lines:
        session.execute(insert(T), [n.row for n in lines])


def newest(session: Session, job_ids: Iterable[str]) -> dict[str, int]:
    """The newest seq of each job's lines, as this transaction sees them."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(T.c.job_id, func.max(T.c.seq)).where(T.c.job_id.in_(ids)).group_by(T.c.job_id)
    )
    return {job_id: int(seq) for job_id, seq in rows}


def sizes(session: Session, task_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(lines, bytes) stored per task; tasks with none are absent."""
    ids = list(task_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(T.c.task_id, func.count(), func.coalesce(func.sum(T.c.bytes), 0))
        .where(T.c.task_id.in_(ids))
        .group_by(T.c.task_id)
    )
    return {task_id: (int(n), int(b)) for task_id, n, b in rows}


def rotate(session: Session, task_id: str, bounds: LogBounds) -> tuple[int, int]:
    """Cut the task's lines down to the low-water mark (oldest first, the newest removed row left
    as a marker counting every line it replaces); the (lines, bytes) it then holds."""
    newest = session.execute(
        select(T.c.seq, T.c.bytes)
        .where(T.c.task_id == task_id)
        .order_by(T.c.seq.desc())
        .limit(bounds.keep_lines)
    ).all()
    pairs = [(int(s), int(b)) for s, b in newest]
    cut = rotation_cut(pairs, bounds)
    if cut is None:
        return len(pairs), sum(b for _, b in pairs)
    # A marker already among the removed rows carries its count forward.
    removed = session.scalar(
        select(func.sum(case((T.c.dropped > 0, T.c.dropped), else_=1))).where(
            T.c.task_id == task_id, T.c.seq <= cut
        )
    )
    text = rotated_marker(int(removed or 0))
    session.execute(delete(T).where(T.c.task_id == task_id, T.c.seq < cut))
    session.execute(
        update(T)
        .where(T.c.seq == cut)
        .values(stream=MARKER_STREAM, line=text, bytes=len(text), dropped=int(removed or 0))
    )
    kept = [b for s, b in pairs if s > cut]
    return len(kept) + 1, sum(kept) + len(text)


def read(
    session: Session,
    job_id: str,
    *,
    task_id: str | None = None,
    after: int = 0,
    tail: int | None = None,
    limit: int = 1000,
) -> list[LogRow]:
    """The job's lines (one task's with ``task_id``) with seq > ``after``, oldest first: the first
    ``limit`` of them, or with ``tail`` the last ``tail``."""
    stmt = (
        select(T.c.seq, T.c.task_id, Task.region, T.c.created_at, T.c.stream, T.c.line, T.c.dropped)
        .join(Task, Task.id == T.c.task_id)
        .where(T.c.job_id == job_id, T.c.seq > after)
    )
    if task_id is not None:
        stmt = stmt.where(T.c.task_id == task_id)
    if tail is not None:
        rows = list(session.execute(stmt.order_by(T.c.seq.desc()).limit(tail)))[::-1]
    else:
        rows = list(session.execute(stmt.order_by(T.c.seq).limit(limit)))
    return [LogRow(*row) for row in rows]


def prune_ended(session: Session, ended_before: datetime) -> int:
    """Delete the lines of jobs that ended before ``ended_before``; how many rows went."""
    ended = select(Job.id).where(Job.finished_at.is_not(None), Job.finished_at < ended_before)
    result = session.execute(delete(T).where(T.c.job_id.in_(ended)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
