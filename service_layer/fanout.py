"""One bus subscription per server process, fanned out to every open event stream.

Each SSE stream used to open its own subscription (on Redis, its own connection): 200 streams,
206 connections. Here the process subscribes once to ``job.*`` and hands each message to the
queues of the streams that follow that job. A stream's queue is bounded: a client that stops
reading loses live messages rather than growing the server's memory, and catches up from the
database, which stays the source of truth (streams re-read it every keep-alive).

Streams are also counted per tenant; past ``max_per_tenant`` a new one is refused (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator

from contracts.errors import ResourceExhausted
from orchestration.bus.base import Bus, Message

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000
RETRY_S = 1.0


class Fanout:
    def __init__(self, bus: Bus, pattern: str = "job.*", max_per_tenant: int = 16) -> None:
        self.bus, self.pattern, self.max_per_tenant = bus, pattern, max_per_tenant
        self._queues: dict[str, set[asyncio.Queue[tuple[str, Message]]]] = defaultdict(set)
        self._per_tenant: dict[str, int] = defaultdict(int)
        self._task: asyncio.Task[None] | None = None
        self._live = asyncio.Event()
        self.dropped = 0

    def check_capacity(self, tenant_id: str) -> None:
        """Raise ResourceExhausted when the tenant has no stream left."""
        open_now = self._per_tenant.get(tenant_id, 0)
        if open_now >= self.max_per_tenant:
            raise ResourceExhausted(
                f"tenant already has {open_now} open event streams (at most {self.max_per_tenant});"
                " close one first",
                limit=self.max_per_tenant,
            )

    @contextlib.asynccontextmanager
    async def subscribe(
        self, channel: str, tenant_id: str, also: tuple[str, ...] = ()
    ) -> AsyncIterator[AsyncIterator[tuple[str, Message]]]:
        """Messages on ``channel`` (and the ``also`` channels, into the same queue: still one
        stream) from the moment this is entered (the shared subscription is live)."""
        self.check_capacity(tenant_id)
        self._per_tenant[tenant_id] += 1
        queue: asyncio.Queue[tuple[str, Message]] = asyncio.Queue(QUEUE_SIZE)
        channels = (channel, *also)
        for name in channels:
            self._queues[name].add(queue)
        try:
            self._ensure_running()
            await self._live.wait()
            yield _drain(queue)
        finally:
            for name in channels:
                self._queues[name].discard(queue)
                if not self._queues[name]:
                    del self._queues[name]
            self._per_tenant[tenant_id] -= 1
            if not self._per_tenant[tenant_id]:
                del self._per_tenant[tenant_id]

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event-fanout")

    async def _run(self) -> None:
        while True:
            try:
                async with self.bus.subscribe(self.pattern) as messages:
                    self._live.set()
                    async for channel, message in messages:
                        for q in list(self._queues.get(channel, ())):
                            try:
                                q.put_nowait((channel, message))
                            except asyncio.QueueFull:
                                self.dropped += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                # Streams keep going on their database re-reads while the bus is away.
                log.exception("event fan-out subscription failed; resubscribing in %.0fs", RETRY_S)
                self._live.clear()
                await asyncio.sleep(RETRY_S)
                self._live.set()  # no one waits forever on a broken bus: the database still serves

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def _drain(queue: asyncio.Queue[tuple[str, Message]]) -> AsyncIterator[tuple[str, Message]]:
    while True:
        yield await queue.get()
