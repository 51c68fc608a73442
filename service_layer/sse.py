"""A job's events as server-sent events: the persisted history first, then live from the bus.

The subscription opens before the history is read, so nothing published in between is lost;
events carry their row id, which de-duplicates the overlap and serves as the SSE ``id`` (a client
resumes with ``Last-Event-ID``). Messages that are not persisted (per-step ``task.metrics``) pass
straight through without an id. The database stays the source of truth: when the job reaches a
terminal state the stream re-reads what it has not sent yet, sends it, and ends. The loop itself
is ``service_layer.sse_follow``'s, shared with the log stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from orchestration.bus.base import Message
from orchestration.context import ServerContext
from orchestration.db.models import Job
from orchestration.events import job_channel
from service_layer.fanout import Fanout
from service_layer.queries import job_events
from service_layer.sse_follow import KEEPALIVE_S, follow_job, format_event


def _unsent(ctx: ServerContext, job_id: str, after: int) -> tuple[list[dict[str, Any]], str]:
    """Events after ``after`` and the job's status, in one short transaction.

    The status is read first: under PostgreSQL's read committed each statement sees what had
    committed when it began, so events read afterwards include those committed with that status;
    read the other way round, a job ending in between gave a terminal status without its last
    events, and the stream ended without them."""
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        status = job.status if job is not None else "unknown"
        events = [e.model_dump(mode="json") for e in job_events(session, job_id, after)]
        return events, status


class _Events:
    """A job's events after the newest id sent."""

    def __init__(self, ctx: ServerContext, job_id: str, after: int) -> None:
        self._ctx, self._job_id = ctx, job_id
        self.last = after  # the newest event id sent
        self.status = "unknown"

    async def read(self) -> AsyncIterator[str]:
        events, self.status = await asyncio.to_thread(_unsent, self._ctx, self._job_id, self.last)
        for e in events:
            yield format_event(e, id=e["id"])
            self.last = e["id"]

    def notice(self, channel: str, message: Message) -> tuple[list[str], bool]:
        event_id = message.get("id")
        if not isinstance(event_id, int):  # not persisted (e.g. task.metrics): pass through
            return [format_event(message)], False
        if event_id <= self.last:  # already sent from the history
            return [], False
        self.last = event_id
        return [format_event(message, id=event_id)], True


async def job_event_stream(
    ctx: ServerContext,
    fanout: Fanout,
    tenant_id: str,
    job_id: str,
    *,
    after: int = 0,
    follow: bool = True,
    stopping: asyncio.Event | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[str]:
    """Yield SSE frames: every event of the job after id ``after``; with ``follow``, keep going
    until the job ends (then a final ``end`` event) or the server stops."""
    source = _Events(ctx, job_id, after)
    async with (
        fanout.subscribe(job_channel(job_id), tenant_id) as messages,
        contextlib.aclosing(
            follow_job(source, messages, follow=follow, stopping=stopping, keepalive_s=keepalive_s)
        ) as frames,
    ):
        async for frame in frames:
            yield frame
