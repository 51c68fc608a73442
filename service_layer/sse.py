"""A job's events as server-sent events: the persisted history first, then live from the bus.

The subscription opens before the history is read, so nothing published in between is lost;
events carry their row id, which de-duplicates the overlap and serves as the SSE ``id`` (a client
resumes with ``Last-Event-ID``). Messages that are not persisted (per-step ``task.metrics``) pass
straight through without an id. The database stays the source of truth: when the job reaches a
terminal state the stream re-reads what it has not sent yet, sends it, and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from contracts.states import JOB_TERMINAL
from orchestration.context import ServerContext
from orchestration.db.models import Job
from orchestration.events import job_channel
from service_layer.fanout import Fanout
from service_layer.queries import job_events

KEEPALIVE_S = 10.0


def format_event(data: dict[str, Any], *, event: str | None = None, id: int | None = None) -> str:
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":"), default=str))
    return "\n".join(lines) + "\n\n"


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
    last = after
    async with fanout.subscribe(job_channel(job_id), tenant_id) as messages:
        events, status = await asyncio.to_thread(_unsent, ctx, job_id, last)
        for e in events:
            yield format_event(e, id=e["id"])
            last = e["id"]
        if not follow or status in JOB_TERMINAL:
            yield format_event({"status": status}, event="end")
            return
        stop_wait = asyncio.ensure_future(stopping.wait()) if stopping else None
        pending = asyncio.ensure_future(anext(messages))
        checked = time.monotonic()
        try:
            while True:
                waiters = {pending} | ({stop_wait} if stop_wait else set())
                done, _ = await asyncio.wait(
                    waiters, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
                )
                if stop_wait in done:
                    return
                recheck = time.monotonic() - checked >= keepalive_s
                if pending in done:
                    _, message = pending.result()
                    pending = asyncio.ensure_future(anext(messages))
                    event_id = message.get("id")
                    if not isinstance(event_id, int):
                        yield format_event(message)  # not persisted (e.g. task.metrics): pass through
                    elif event_id > last:  # else already sent from the history
                        yield format_event(message, id=event_id)
                        last, recheck = event_id, True
                else:
                    yield ": keep-alive\n\n"
                    recheck = True
                if not recheck:
                    continue
                # Re-read from the database: catches a missed publish and notices the end.
                checked = time.monotonic()
                events, status = await asyncio.to_thread(_unsent, ctx, job_id, last)
                for e in events:
                    yield format_event(e, id=e["id"])
                    last = e["id"]
                if status in JOB_TERMINAL:
                    yield format_event({"status": status}, event="end")
                    return
        finally:
            for fut in (pending, stop_wait):
                if fut is not None:
                    fut.cancel()
                    with contextlib.suppress(BaseException):
                        await fut
