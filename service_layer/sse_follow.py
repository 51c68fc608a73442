"""Following a job as server-sent events: the framing and the loop the event and log streams share.

A stream first sends what the database holds after its cursor, then waits on its subscription,
a keep-alive timer and the server's stop. A live message may carry frames of its own and may call
for a re-read; at least once per keep-alive the stream re-reads anyway, so the database stays the
one source of truth and a message missed or overtaken costs nothing but that wait. The stream ends
with ``event: end`` once a read finds the job ended, and without one when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from contracts.states import JOB_TERMINAL
from orchestration.bus.base import Message

KEEPALIVE_S = 10.0


def format_event(data: dict[str, Any], *, event: str | None = None, id: int | None = None) -> str:
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":"), default=str))
    return "\n".join(lines) + "\n\n"


class Followed(Protocol):
    """What one stream reads, and how it answers a live message."""

    @property
    def status(self) -> str:
        """The job's status as of the last read."""
        ...

    def read(self) -> AsyncIterator[str]:
        """Frames of every row after the cursor not sent yet; sets ``status`` as read with them."""
        ...

    def notice(self, channel: str, message: Message) -> tuple[list[str], bool]:
        """Frames to send for a live message, and whether it calls for a read."""
        ...


async def follow_job(
    source: Followed,
    messages: AsyncIterator[tuple[str, Message]],
    *,
    follow: bool = True,
    stopping: asyncio.Event | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[str]:
    """SSE frames: what ``source`` reads now; with ``follow``, then live until the job ends (a
    final ``end`` event with its status) or ``stopping`` is set.

    ``messages`` must be subscribed before this starts, so nothing published between the first
    read and the wait is lost. Callers close this generator (``contextlib.aclosing``) before the
    subscription, so the pending read of ``messages`` is cancelled first."""
    async for frame in source.read():
        yield frame
    if not follow or source.status in JOB_TERMINAL:
        yield format_event({"status": source.status}, event="end")
        return
    stop_wait = asyncio.ensure_future(stopping.wait()) if stopping else None
    pending = asyncio.ensure_future(anext(messages))
    checked = time.monotonic()
    try:
        while True:
            waiters = {pending} | ({stop_wait} if stop_wait else set())
            done, _ = await asyncio.wait(waiters, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
            if stop_wait in done:
                return
            read = time.monotonic() - checked >= keepalive_s
            if pending in done:
                channel, message = pending.result()
                pending = asyncio.ensure_future(anext(messages))
                frames, wanted = source.notice(channel, message)
                for frame in frames:
                    yield frame
                read = read or wanted
            else:
                yield ": keep-alive\n\n"
                read = True
            if not read:
                continue
            # Re-read from the database: catches a missed publish and notices the end.
            checked = time.monotonic()
            async for frame in source.read():
                yield frame
            if source.status in JOB_TERMINAL:
                yield format_event({"status": source.status}, event="end")
                return
    finally:
        for fut in (pending, stop_wait):
            if fut is not None:
                fut.cancel()
                with contextlib.suppress(BaseException):
                    await fut
