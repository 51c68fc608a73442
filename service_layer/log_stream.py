"""A job's log lines: read a page, or follow them as server-sent events.

Lines live in ``task_logs`` (``orchestration.logs``); each carries a ``seq`` that orders the
job's lines and is the SSE ``id``, so a client resumes with ``Last-Event-ID``. Following, the
stream listens (through the process's one fan-out subscription) on ``job.<id>.logs``, where a
writer says after each commit that the job has lines up to some seq, and on ``job.<id>`` for the
job's end; on either it reads the table after the last seq it sent. The table stays the one
source of order, so a notice missed or overtaken costs nothing but the wait for the next
keep-alive, when the stream re-reads anyway. It ends, with ``event: end``, once the job has ended
and every line stored by then is sent (a task's lines are stored before its end is handled).
The loop itself is ``service_layer.sse_follow``'s, shared with the event stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument, NotFound
from contracts.states import JOB_TERMINAL
from orchestration.bus.base import Message
from orchestration.context import ServerContext
from orchestration.db.models import Job, Task
from orchestration.events import job_channel
from orchestration.logs import store
from service_layer.fanout import Fanout
from service_layer.log_cursor import FollowCursor
from service_layer.schemas.logs import LogLine
from service_layer.sse_follow import KEEPALIVE_S, follow_job, format_event

PAGE = 1000  # lines per read while following
ENDED = frozenset(f"job.{s}" for s in JOB_TERMINAL)  # event kinds that end a job


def resolve_task(session: Session, job_id: str, task: str | None) -> str | None:
    """The job's task named by ``task``: its id or a unique prefix (``cpn jobs show`` prints 8)."""
    if task is None:
        return None
    ids = session.scalars(select(Task.id).where(Task.job_id == job_id, Task.id.startswith(task))).all()
    if not ids:
        raise NotFound(f"job {job_id} has no task {task}", field="task")
    if len(ids) > 1:
        raise InvalidArgument(
            f"task: {task!r} names {len(ids)} of the job's tasks; give more of it", field="task"
        )
    return ids[0]


def to_api(row: store.LogRow) -> LogLine:
    return LogLine(
        seq=row.seq,
        task_id=row.task_id,
        region=row.region,
        time=row.created_at,
        stream=row.stream,
        line=row.line,
        dropped=row.dropped,
    )


def text_line(line: LogLine) -> str:
    """``[task/region stream] line``, as ``cpn jobs logs`` prints it."""
    return f"[{line.task_id[:8]}/{line.region} {line.stream}] {line.line}"


def _unsent(
    ctx: ServerContext, job_id: str, task_id: str | None, after: int, tail: int | None
) -> tuple[list[LogLine], str]:
    """Lines after ``after`` and the job's status, status read first (as ``sse._unsent`` explains:
    lines read afterwards include every one stored before that status committed)."""
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        status = job.status if job is not None else "unknown"
        rows = store.read(session, job_id, task_id=task_id, after=after, tail=tail, limit=PAGE)
        return [to_api(r) for r in rows], status


class _Lines:
    """A job's (or one task's) lines above the cursor's floor."""

    def __init__(
        self, ctx: ServerContext, job_id: str, task_id: str | None, after: int, tail: int | None
    ) -> None:
        self._ctx, self._job_id, self._task_id = ctx, job_id, task_id
        self._tail = tail  # only the stream's first read takes the last ``tail`` lines
        self.cursor = FollowCursor(after)

    @property
    def status(self) -> str:
        return self.cursor.status

    async def read(self) -> AsyncIterator[str]:
        """Frames of every line not sent yet, read page by page from the cursor's floor up to the
        newest (only the last ``tail`` on the stream's first read); the job's status read with the
        last page lands in ``cursor.status``."""
        cursor, tail, self._tail = self.cursor, self._tail, None
        after = cursor.floor
        while True:
            lines, status = await asyncio.to_thread(
                _unsent, self._ctx, self._job_id, self._task_id, after, tail
            )
            if tail is not None and lines:
                cursor.skip_before(lines[0].seq)
            for line in cursor.unsent(lines):
                yield format_event(line.model_dump(mode="json"), id=line.seq)
            if tail is None and len(lines) < PAGE:
                break
            after = lines[-1].seq if lines and tail is None else cursor.last
            tail = None  # after the tail, read on to the newest line
        cursor.status = status
        cursor.read_done(time.monotonic())

    def notice(self, channel: str, message: Message) -> tuple[list[str], bool]:
        if channel == job_channel(self._job_id):  # job events: only its end matters here
            return [], message.get("kind") in ENDED
        # new lines up to seq (a notice only for lines surely sent is skipped)
        seq = message.get("seq")
        return [], not isinstance(seq, int) or seq > self.cursor.floor


async def job_log_stream(
    ctx: ServerContext,
    fanout: Fanout,
    tenant_id: str,
    job_id: str,
    *,
    task_id: str | None = None,
    after: int = 0,
    tail: int | None = None,
    stopping: asyncio.Event | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[str]:
    """SSE frames: the lines after ``after`` (only the last ``tail`` of them, if given), then live
    lines until the job ends (a final ``end`` event with its status) or the server stops."""
    source = _Lines(ctx, job_id, task_id, after, tail)
    subscription = fanout.subscribe(store.logs_channel(job_id), tenant_id, also=(job_channel(job_id),))
    async with (
        subscription as messages,
        contextlib.aclosing(
            follow_job(source, messages, stopping=stopping, keepalive_s=keepalive_s)
        ) as frames,
    ):
        async for frame in frames:
            yield frame
