"""Workers' log lines from the agents' streams into ``task_logs``, in batches.

The gRPC reader only appends a line to a list (no thread hop, no I/O), so a chatty worker costs
its stream almost nothing. A flusher writes whatever arrived every ``log_flush_s`` in ONE
transaction, rotates the tasks that went over their bounds in the same transaction, and after the
commit tells each job's followers on the bus (one message per job per flush, not per line).
Past ``log_max_pending_lines`` waiting (the database is slow or away), lines are counted instead
of kept and a marker line records how many were dropped; a failed write is counted the same way.

Lines are stored only for a task that exists and runs on the node that sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.models import Task
from orchestration.logs import store
from orchestration.logs.rotation import MARKER_STREAM, LogBounds, dropped_marker, over

log = logging.getLogger(__name__)

AGENT_STREAMS = frozenset({"stdout", "stderr", "agent"})
CACHED_TASKS = 10_000
# A task's stored size is re-read after this long without a line here (another replica may have
# written to it meanwhile, when its node's stream moved).
STALE_S = 30.0


@dataclass
class _Seen:
    job_id: str
    node_id: str
    lines: int
    nbytes: int
    at: float


@dataclass(frozen=True)
class _Line:
    node_id: str
    task_id: str
    stream: str
    line: str
    at: datetime  # when it arrived


class TaskLogBatcher:
    def __init__(self, ctx: ServerContext) -> None:
        s = ctx.settings
        self._ctx = ctx
        self._every = s.log_flush_s
        self._max_pending = s.log_max_pending_lines
        self._bounds = LogBounds(s.log_max_lines_per_task, s.log_max_bytes_per_task)
        self._pending: list[_Line] = []
        self._dropped: dict[tuple[str, str], int] = {}  # (node, task) -> lines not kept
        self._seen: OrderedDict[str, _Seen] = OrderedDict()  # used by the flush thread only
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.written = 0

    def add(self, node_id: str, task_id: str, stream: str, line: str) -> None:
        """Queue one line (on the event loop; starts the flusher if needed). Refuses a stream name
        the agent does not send; ``cpn``, the markers', is the control plane's own."""
        if stream not in AGENT_STREAMS:
            raise InvalidArgument(f"log.stream must be one of {sorted(AGENT_STREAMS)}, got {stream[:20]!r}")
        if len(self._pending) >= self._max_pending:
            key = (node_id, task_id)
            self._dropped[key] = self._dropped.get(key, 0) + 1
        else:  # cut now: what waits in memory is bounded by lines x the column's width
            self._pending.append(_Line(node_id, task_id, stream, line[: store.MAX_LINE_CHARS], utcnow()))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="task-log-flush")

    async def flush(self) -> None:
        """Write everything queued so far (a task's lines are stored before its end is handled)."""
        async with self._lock:
            batch, self._pending = self._pending, []
            dropped, self._dropped = self._dropped, {}
            if not batch and not dropped:
                return
            try:
                await asyncio.to_thread(self._write, batch, dropped)
            except Exception:
                log.exception("writing %d log lines failed; recording them as dropped", len(batch))
                for line in batch:
                    key = (line.node_id, line.task_id)
                    dropped[key] = dropped.get(key, 0) + 1
                for key, n in dropped.items():
                    self._dropped[key] = self._dropped.get(key, 0) + n
                self._seen.clear()  # the rolled-back transaction may have rotated nothing

    async def _run(self) -> None:
        while self._pending or self._dropped:
            await asyncio.sleep(self._every)
            await self.flush()

    async def close(self) -> None:
        """Stop the flusher after writing what is queued."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.flush()

    # -- in a worker thread -------------------------------------------------------------------
    def _write(self, batch: list[_Line], dropped: dict[tuple[str, str], int]) -> None:
        ids = {line.task_id for line in batch} | {task for _, task in dropped}
        with self._ctx.session_factory() as session, session.begin():
            owners = self._owners(session, ids)
            rows: list[store.NewLine] = []
            for line in batch:
                seen = owners.get(line.task_id)
                if seen is None or seen.node_id != line.node_id:
                    continue  # not a task of that node: nothing to keep it under
                rows.append(store.new_line(seen.job_id, line.task_id, line.stream, line.line, line.at))
            now = utcnow()
            for (node_id, task_id), n in dropped.items():
                seen = owners.get(task_id)
                if seen is not None and seen.node_id == node_id:
                    rows.append(
                        store.new_line(seen.job_id, task_id, MARKER_STREAM, dropped_marker(n), now, n)
                    )
            store.append(session, rows)
            touched: set[str] = set()
            for row in rows:
                seen = owners[row.task_id]
                seen.lines += 1
                seen.nbytes += row.nbytes
                touched.add(row.task_id)
            for task_id in touched:
                seen = owners[task_id]
                if over(seen.lines, seen.nbytes, self._bounds):
                    seen.lines, seen.nbytes = store.rotate(session, task_id, self._bounds)
            newest = store.newest(session, {row.job_id for row in rows})
        self.written += len(rows)
        if newest:
            # After the commit: a follower told of new lines can read them.
            try:
                self._ctx.bus.publish_many(
                    [(store.logs_channel(job), {"kind": "task.logs", "job_id": job, "seq": seq})
                     for job, seq in newest.items()]
                )  # fmt: skip
            except Exception:  # followers re-read the table on their own every few seconds
                log.exception("announcing new log lines failed")

    def _owners(self, session: Session, ids: set[str]) -> dict[str, _Seen]:
        """Each task's job, node and stored size, from the cache or (once) from the database."""
        now = time.monotonic()
        out: dict[str, _Seen] = {}
        missing = []
        for task_id in ids:
            seen = self._seen.get(task_id)
            if seen is not None and now - seen.at < STALE_S:
                seen.at = now
                self._seen.move_to_end(task_id)
                out[task_id] = seen
            else:
                missing.append(task_id)
        if missing:
            rows = session.execute(
                select(Task.id, Task.job_id, Task.node_id).where(Task.id.in_(missing))
            ).all()
            stored = store.sizes(session, [r.id for r in rows])
            for r in rows:
                lines, nbytes = stored.get(r.id, (0, 0))
                out[r.id] = self._seen[r.id] = _Seen(r.job_id, r.node_id, lines, nbytes, now)
            while len(self._seen) > CACHED_TASKS:
                self._seen.popitem(last=False)
        return out
