"""The planner's snapshot kept in memory: loaded once, then updated from the rows that changed.

``build_snapshot`` reads the whole fleet per call (over a second at 1,000 clusters). A running
control plane instead keeps a ``LiveSnapshot``: the same rows (``control_layer.snapshot.FleetRows``,
the one builder of both), which the resource change feed (``orchestration.resource_changes``)
keeps current: it names the nodes, accelerators (allocations), clusters (prices) and topology
rows any replica committed, and the next quote re-reads just those. Unchanged clusters keep their
``ClusterInfo`` objects, so what the planner derives from a cluster can be reused.

Staleness is bounded and harmless: marks arrive after commit (at once in this process, over the
bus from other replicas), a re-subscription and a periodic full reload cover lost bus messages,
and allocation re-checks every device under row locks, so a stale snapshot costs a re-plan,
never a double booking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Collection

from sqlalchemy.orm import Session

from control_layer.heap import settle_long_lived
from control_layer.planner import prepare
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.snapshot import FleetRows, build_snapshot
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.resource_changes import RESOURCE_CHANGES_CHANNEL, ResourceChanges

log = logging.getLogger(__name__)

FULL_RELOAD_S = 300.0  # a safety net: a lost subscription already triggers a full reload
SETTLE_MIN_CLUSTERS = 64  # a small fleet is cheap to walk: not worth a full collection per change


class LiveSnapshot:
    """The snapshot one control-plane process keeps; thread-safe (quotes run in worker threads)."""

    def __init__(self, ctx: ServerContext, *, full_reload_s: float = FULL_RELOAD_S) -> None:
        self._ctx = ctx
        self.full_reload_s = full_reload_s
        self._lock = threading.Lock()  # guards _dirty and _since_load
        self._refresh = threading.Lock()  # one refresher at a time; guards _rows
        self._dirty = ResourceChanges(everything=True)
        self._since_load: ResourceChanges | None = None  # marks made while a full reload reads
        self._rows: FleetRows | None = None
        self.listening = threading.Event()  # set while run_live_snapshot hears the bus

    def mark(self, changes: ResourceChanges) -> None:
        with self._lock:
            self._dirty.merge(changes)
            if self._since_load is not None:
                self._since_load.merge(changes)

    def snapshot(self, exclude_nodes: Collection[str] = ()) -> ResourceSnapshot:
        """The fleet now: what was marked since the last call is re-read first."""
        with self._refresh:
            with self._lock:
                changes, self._dirty = self._dirty, ResourceChanges()
            rows = self._rows
            too_old = rows is not None and time.monotonic() - rows.loaded_at > 2 * self.full_reload_s
            with session_scope(self._ctx.session_factory) as session:
                if rows is None or changes.everything or too_old:
                    rows = FleetRows(link_fresh_s=self._ctx.settings.effective_link_fresh_s)
                    rows.load_all(session)
                    self._rows = rows
                elif changes or rows.next_price_at is not None or rows.links_due():
                    rows.apply(session, changes)
            snap = rows.snapshot(exclude_nodes)
            _settle_if_grown(rows)
            return snap

    def reload(self) -> None:
        """Read everything afresh without holding up quotes; re-apply what changed meanwhile."""
        with self._lock:
            self._since_load = ResourceChanges()
        try:
            rows = FleetRows(link_fresh_s=self._ctx.settings.effective_link_fresh_s)
            with session_scope(self._ctx.session_factory) as session:
                rows.load_all(session)
        finally:
            with self._lock:
                meanwhile, self._since_load = self._since_load, None
        rows.snapshot()  # assembled here, off the quote path
        with self._refresh:
            with self._lock:
                self._dirty = meanwhile or ResourceChanges()
            self._rows = rows
            _settle_if_grown(rows)


def _settle_if_grown(rows: FleetRows) -> None:
    """Once most of the fleet is newly built (a full load, or a fleet that arrived through
    registrations): derive the pools quotes reuse, then settle the heap with them in it
    (``control_layer.heap``). Each quote's few changed clusters wait until they add up to half
    the fleet."""
    if rows.rebuilt >= max(SETTLE_MIN_CLUSTERS, len(rows.built) // 2):
        rows.rebuilt = 0
        prepare(rows.snapshot())
        settle_long_lived()


def attach_live_snapshot(ctx: ServerContext, *, full_reload_s: float = FULL_RELOAD_S) -> LiveSnapshot:
    """Give ``ctx`` an in-memory snapshot fed by its own commits (at once) and, while
    ``run_live_snapshot`` runs, by other replicas' commits over the bus."""
    live = LiveSnapshot(ctx, full_reload_s=full_reload_s)
    ctx.resource_changes.subscribe(live.mark)
    ctx.live_snapshot = live
    return live


def detach_live_snapshot(ctx: ServerContext) -> None:
    live = ctx.live_snapshot
    if isinstance(live, LiveSnapshot):
        ctx.resource_changes.unsubscribe(live.mark)
    ctx.live_snapshot = None


def current_snapshot(
    ctx: ServerContext, session: Session, *, exclude_nodes: Collection[str] = ()
) -> ResourceSnapshot:
    """The live snapshot where this process keeps one, else one read from ``session``."""
    live = ctx.live_snapshot
    if isinstance(live, LiveSnapshot):
        return live.snapshot(exclude_nodes)
    fresh_s = ctx.settings.effective_link_fresh_s
    return build_snapshot(session, exclude_nodes=exclude_nodes, link_fresh_s=fresh_s)


async def run_live_snapshot(ctx: ServerContext, stop: asyncio.Event, *, retry_s: float = 1.0) -> None:
    """Hear other replicas' changes, and reload in full every ``full_reload_s``, until ``stop``."""
    live = ctx.live_snapshot
    if not isinstance(live, LiveSnapshot):
        raise RuntimeError("run_live_snapshot needs attach_live_snapshot(ctx) first")
    own = ctx.resource_changes.origin

    async def listen() -> None:
        while not stop.is_set():
            try:
                async with ctx.bus.subscribe(RESOURCE_CHANGES_CHANNEL) as messages:
                    live.mark(ResourceChanges(everything=True))  # what was said before we listened
                    live.listening.set()
                    async for _channel, message in messages:
                        if message.get("origin") != own:  # our own commits marked us already
                            live.mark(ResourceChanges.from_message(message))
            except Exception:
                log.exception("resource-change subscription failed; retrying")
            finally:
                live.listening.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)

    listener = asyncio.create_task(listen(), name="live-snapshot-listen")
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), live.full_reload_s)
            if not stop.is_set():
                try:
                    await asyncio.to_thread(live.reload)
                except Exception:
                    log.exception("full reload of the live snapshot failed")
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
