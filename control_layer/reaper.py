"""The node reaper: marks nodes lost once their liveness key has expired. It only detects: failing a
lost node's tasks moves their jobs back to the queue, and the placer re-places them. Each pass also
requeues preempted jobs whose tasks never reported stopping (``preemption.expire_preemptions``).

The resource layer touches ``node.<id>.alive`` on every heartbeat with a TTL of
interval x misses. Only the elected leader replica reaps (``orchestration.leadership``), and its
writes are fenced: a deposed leader's late pass commits nothing.

A reaper that has just started judges no node until it has been up for the restart grace
(``Settings.reaper_grace_s``). While the control plane was down (or starting, which can take longer
than the loss threshold) no agent could heartbeat, so every liveness key may have expired and every
recorded heartbeat may be old: that silence says nothing about the nodes, only about us. After the
grace, a node counts as alive only on a heartbeat received within the loss threshold, which by then
means one received since this reaper started; agents cap their reconnect backoff below the
threshold, so every live one has been heard by then.

The same holds, in small, for a control plane that stalled (a starved process on a busy host): while
its loop ran nothing, heartbeats that came waited unread. The reaper and a watcher beside it measure
how late the loop's ticks came (``LoopClock``, ``Stalls``), and the reaper counts a node's silence
only in the time the plane was running since its last heartbeat: a stall extends the threshold for
the nodes it overlapped, never the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from datetime import datetime, timedelta

from sqlalchemy import select

from control_layer.preemption import expire_preemptions
from control_layer.reactions import on_node_lost
from orchestration.artifacts import probe as store_probe
from orchestration.artifacts import records as artifact_records
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Node
from orchestration.logs import store as task_logs
from resource_layer.liveness import node_alive_key

log = logging.getLogger(__name__)

LOG_PRUNE_EVERY_S = 600.0


def is_lost(
    *,
    up_for_s: float,
    grace_s: float,
    key_alive: bool,
    last_heard: datetime,
    now: datetime,
    lost_after_s: float,
    stalled_s: float = 0.0,
) -> bool:
    """Whether a node is lost: the reaper is past its start-up grace, the node's liveness key has
    expired, and the last heartbeat recorded for it is older than the loss threshold plus the
    seconds the control plane itself stalled since (``stalled_s``). Pure."""
    if up_for_s < grace_s or key_alive:
        return False
    return last_heard < now - timedelta(seconds=lost_after_s + stalled_s)


class Stalls:
    """How late the reaper's passes came, as (when the late pass ran, seconds late): the time its
    process could not run, in which heartbeats may have waited unread. Kept for ``horizon_s``."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.seen: deque[tuple[datetime, float]] = deque()

    def add(self, at: datetime, late_s: float) -> None:
        self.seen.append((at, late_s))
        while self.seen and self.seen[0][0] < at - timedelta(seconds=self.horizon_s):
            self.seen.popleft()

    def since(self, when: datetime) -> float:
        """Seconds stalled after ``when`` (a stall that ended after it counts whole)."""
        return sum(late for at, late in self.seen if at > when)


def reap_once(ctx: ServerContext, *, up_for_s: float = math.inf, stalls: Stalls | None = None) -> list[str]:
    """One pass; returns the ids of the nodes it marked lost (empty while this reaper, up for
    ``up_for_s`` seconds, is still within its start-up grace; ``stalls``: the plane's own)."""
    settings = ctx.settings
    lost_after = settings.node_lost_after_s
    if up_for_s < settings.reaper_grace_s:
        return []
    with session_scope(ctx.session_factory) as session:
        alive = session.execute(
            select(Node.id, Node.last_heartbeat_at, Node.registered_at).where(Node.status == "alive")
        ).all()
    if not alive:
        return []
    expired = set(ctx.bus.expired([node_alive_key(row.id) for row in alive]))
    now = utcnow()
    lost = []
    for row in alive:
        heard = as_utc(row.last_heartbeat_at or row.registered_at)
        if is_lost(
            up_for_s=up_for_s,
            grace_s=settings.reaper_grace_s,
            key_alive=node_alive_key(row.id) not in expired,
            last_heard=heard,
            now=now,
            lost_after_s=lost_after,
            stalled_s=stalls.since(heard) if stalls is not None else 0.0,
        ):
            lost.append(row.id)
    why = f"missed {settings.heartbeat_misses} heartbeats ({lost_after:g}s without one)"
    for node_id in lost:
        log.warning("node %s lost: %s", node_id, why)
        on_node_lost(ctx, node_id, why)
    return lost


def prune_logs_once(ctx: ServerContext) -> int:
    """Delete the log lines of jobs that ended more than ``log_retention_days`` ago; how many went.
    Idempotent, so it needs no fencing: a deposed leader's pass deletes what the new one would."""
    cutoff = utcnow() - timedelta(days=ctx.settings.log_retention_days)
    with session_scope(ctx.session_factory) as session:
        removed = task_logs.prune_ended(session, cutoff)
    if removed:
        log.info("pruned %d log lines of jobs ended before %s", removed, cutoff.isoformat())
    return removed


def sweep_artifacts_once(ctx: ServerContext) -> artifact_records.Swept:
    """Retention of the artifact store: expired rows, blobs no row names (the store probe's
    kept), unfinished uploads."""
    keep = store_probe.digests(ctx.settings.link_probe_bytes)
    return artifact_records.sweep(ctx.session_factory, ctx.artifacts, utcnow(), keep=keep)


class LoopClock:
    """When the loop last ran a tick, shared by the reaper and a watcher beside it: a tick more than
    ``every_s`` after the one before means the loop ran nothing for the difference, so heartbeats
    that came meanwhile waited unread. Whoever ticks first after a stall records it, once: the
    reaper ticks before each pass (so the pass counts it), the watcher while a pass runs in its
    thread (so a stall then counts too)."""

    def __init__(self, stalls: Stalls, every_s: float, warn_s: float) -> None:
        self.stalls, self.every_s, self.warn_s = stalls, every_s, warn_s
        self.last = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        late = now - self.last - self.every_s
        self.last = now
        if late > self.every_s:
            self.stalls.add(utcnow(), late)
            if late > self.warn_s:
                log.warning("control plane stalled %.1fs: that silence is not counted against nodes", late)


async def watch_loop(clock: LoopClock) -> None:
    """Tick ``clock`` every ``clock.every_s`` until cancelled."""
    while True:
        await asyncio.sleep(clock.every_s)
        clock.tick()


async def run_reaper(ctx: ServerContext, stop: asyncio.Event, stalls: Stalls | None = None) -> None:
    """Reap four times per heartbeat interval until ``stop`` is set; a failed pass is logged, not fatal.
    Old jobs' log lines and expired artifacts are pruned at start and every ``LOG_PRUNE_EVERY_S``.

    Polling faster than the interval keeps detection close to interval x misses after the last heartbeat.
    """
    interval = ctx.settings.heartbeat_interval_s / 4
    stalls = stalls if stalls is not None else Stalls(horizon_s=10 * ctx.settings.node_lost_after_s)
    clock = LoopClock(stalls, interval, ctx.settings.heartbeat_interval_s)
    watcher = asyncio.create_task(watch_loop(clock))
    try:
        await _reap_until(ctx, stop, clock)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _reap_until(ctx: ServerContext, stop: asyncio.Event, clock: LoopClock) -> None:
    interval, stalls = clock.every_s, clock.stalls
    started = time.monotonic()
    pruned_at = -math.inf
    log.info("reaper up: no node is judged lost for the first %.1fs", ctx.settings.reaper_grace_s)
    while not stop.is_set():
        clock.tick()  # a stall just ended is recorded before this pass reads the stalls
        try:
            up_for = time.monotonic() - started
            await asyncio.to_thread(reap_once, ctx, up_for_s=up_for, stalls=stalls)
            if up_for >= ctx.settings.reaper_grace_s:
                # Preemptions whose tasks never reported stopping: the same silence, per job (and
                # the same grace: after a restart, agents replay how their tasks ended).
                await asyncio.to_thread(expire_preemptions, ctx)
        except Exception:
            log.exception("reaper pass failed")
        if time.monotonic() - pruned_at >= LOG_PRUNE_EVERY_S:
            pruned_at = time.monotonic()
            try:
                await asyncio.to_thread(prune_logs_once, ctx)
            except Exception:
                log.exception("pruning old log lines failed")
            try:
                await asyncio.to_thread(sweep_artifacts_once, ctx)
            except Exception:
                log.exception("the artifact sweep failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
