"""The node reaper: marks nodes lost once their liveness key has expired. It only detects: failing a
lost node's tasks moves their jobs back to pending, and the placer re-places them.

The resource layer touches ``node.<id>.alive`` on every heartbeat with a TTL of
interval x misses. Only one control-plane replica reaps at a time (it holds the bus lock). A node
is also given the benefit of its last recorded heartbeat, so a control plane that has just
restarted with an empty in-process bus does not declare its whole fleet lost at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from sqlalchemy import select

from control_layer.reactions import on_node_lost
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Node
from resource_layer.liveness import node_alive_key

log = logging.getLogger(__name__)

REAPER_LOCK = "reaper"


def reap_once(ctx: ServerContext) -> list[str]:
    """One pass; returns the ids of the nodes it marked lost (empty if another replica holds the lock)."""
    lost_after = ctx.settings.node_lost_after_s
    with ctx.bus.lock(REAPER_LOCK, ttl_s=max(10.0, 5 * lost_after)) as held:
        if not held:
            return []
        with session_scope(ctx.session_factory) as session:
            alive = session.execute(
                select(Node.id, Node.last_heartbeat_at, Node.registered_at).where(Node.status == "alive")
            ).all()
        if not alive:
            return []
        expired = set(ctx.bus.expired([node_alive_key(row.id) for row in alive]))
        cutoff = utcnow() - timedelta(seconds=lost_after)
        lost = [
            row.id
            for row in alive
            if node_alive_key(row.id) in expired
            and as_utc(row.last_heartbeat_at or row.registered_at) < cutoff
        ]
        why = f"missed {ctx.settings.heartbeat_misses} heartbeats ({lost_after:g}s without one)"
        for node_id in lost:
            log.warning("node %s lost: %s", node_id, why)
            on_node_lost(ctx, node_id, why)
        return lost


async def run_reaper(ctx: ServerContext, stop: asyncio.Event) -> None:
    """Reap four times per heartbeat interval until ``stop`` is set; a failed pass is logged, not fatal.

    Polling faster than the interval keeps detection close to interval x misses after the last heartbeat.
    """
    interval = ctx.settings.heartbeat_interval_s / 4
    while not stop.is_set():
        try:
            await asyncio.to_thread(reap_once, ctx)
        except Exception:
            log.exception("reaper pass failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
