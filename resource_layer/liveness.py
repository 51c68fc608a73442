"""Node liveness: the bus key each heartbeat touches with a TTL of interval x misses, and the
nodes' ``last_heartbeat_at`` rows, both refreshed in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from contracts.device_samples import GpuReport
from orchestration.bus.base import Bus

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 0.05


def node_alive_key(node_id: str) -> str:
    """The bus key the resource layer touches on each heartbeat and the reaper checks."""
    return f"node.{node_id}.alive"


class LivenessBatcher:
    """Refreshes the liveness keys of heartbeating nodes in batches: one bus round trip per
    ``flush_every_s`` for however many heartbeats arrived, instead of a thread hop and a round trip
    each. The delay it adds (at most ``flush_every_s``) is far inside any TTL."""

    def __init__(
        self,
        bus: Bus,
        ttl_s: float,
        flush_every_s: float = FLUSH_EVERY_S,
        on_flushed: Callable[[int], object] | None = None,
    ) -> None:
        self._bus, self._ttl_s, self._every = bus, ttl_s, flush_every_s
        self._on_flushed = on_flushed  # told how many heartbeats each flush made count
        self._pending: set[str] = set()
        self._heard = 0
        self._task: asyncio.Task[None] | None = None

    def touch(self, node_id: str) -> None:
        """Mark the node alive at the next flush (on the event loop; starts the flusher if needed)."""
        self._pending.add(node_id)
        self._heard += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="liveness-flush")

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(self._every)
            batch, self._pending = self._pending, set()
            heard, self._heard = self._heard, 0
            try:
                await asyncio.to_thread(self._bus.touch_many, [node_alive_key(n) for n in batch], self._ttl_s)
            except Exception:
                log.exception("refreshing %d liveness keys failed; retrying with the next batch", len(batch))
                self._pending |= batch
                self._heard += heard
                continue
            if self._on_flushed is not None:
                self._on_flushed(heard)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


ROWS_FLUSH_EVERY_S = 0.25


class HeartbeatRows:
    """Writes nodes' ``last_heartbeat_at`` (and contention) in batches: one short transaction per
    ``flush_every_s`` for every node due, instead of a thread hop and a transaction per node. The
    column lags by at most ``flush_every_s`` more than its throttle, far inside the loss threshold."""

    def __init__(
        self,
        persist: Callable[
            [dict[str, float | None], dict[str, tuple[datetime, ...]], dict[str, GpuReport]], None
        ],
        flush_every_s: float = ROWS_FLUSH_EVERY_S,
    ) -> None:
        self._persist, self._every = persist, flush_every_s
        self._pending: dict[str, float | None] = {}
        self._probed: dict[str, tuple[datetime, ...]] = {}  # when the probes behind each figure ran
        self._gpus: dict[str, GpuReport] = {}  # a GPU node's newest device samples and health
        self._task: asyncio.Task[None] | None = None

    def note(
        self,
        node_id: str,
        contention: float | None,
        probed_at: Sequence[datetime] = (),
        gpus: GpuReport | None = None,
    ) -> None:
        """Record the node's heartbeat at the next flush (on the event loop)."""
        self._pending[node_id] = contention
        self._probed[node_id] = tuple(probed_at)
        if gpus is not None:
            self._gpus[node_id] = gpus
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="heartbeat-rows")

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(self._every)
            batch, self._pending = self._pending, {}
            probed, self._probed = self._probed, {}
            gpus, self._gpus = self._gpus, {}
            try:
                await asyncio.to_thread(self._persist, batch, probed, gpus)
            except Exception:
                log.exception("recording %d heartbeats failed; retrying with the next batch", len(batch))
                self._pending = batch | self._pending
                self._probed = probed | self._probed
                self._gpus = gpus | self._gpus

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
