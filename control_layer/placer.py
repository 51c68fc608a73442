"""The placer: plans and places pending jobs, off the request path.

Submission stores a job as pending and wakes the placer on the bus (``lifecycle.PLACER_CHANNEL``);
so does a job going back to pending after a failure and any release of devices. The placer also
polls, so a lost wake-up only delays placement. Only the elected leader replica places
(``orchestration.leadership``), which keeps replicas from planning the same job against each other;
its writes are fenced, so a deposed leader's late placement commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sqlalchemy import select

from contracts.states import JobState
from control_layer.calibration_store import load_calibration
from control_layer.jobs import place_job
from control_layer.lifecycle import PLACER_CHANNEL
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job
from orchestration.leadership import Deposed

log = logging.getLogger(__name__)


def place_pending(ctx: ServerContext) -> list[str]:
    """One pass over the pending jobs, oldest first; returns their ids."""
    with session_scope(ctx.session_factory) as session:
        ids = list(
            session.scalars(select(Job.id).where(Job.status == JobState.PENDING).order_by(Job.created_at))
        )
        # read once per pass, not per job: it moves only when runs finish
        calibration = load_calibration(session) if ids else None
    if not ids:
        return []
    for job_id in ids:
        start = time.perf_counter()
        outcome = "error"
        try:
            outcome = place_job(ctx, job_id, calibration=calibration)
        except Deposed:
            raise  # no longer the leader: the next one places the rest
        except Exception:  # one job's failure must not hold up the others
            log.exception("placing job %s failed; it stays pending", job_id)
        ctx.metrics.placements.labels(outcome).observe(time.perf_counter() - start)
    return ids


async def run_placer(ctx: ServerContext, stop: asyncio.Event, *, interval_s: float | None = None) -> None:
    """Place whenever woken, and at least every ``interval_s``, until ``stop`` is set."""
    interval = interval_s if interval_s is not None else ctx.settings.heartbeat_interval_s
    woken = asyncio.Event()

    async def listen() -> None:
        async with ctx.bus.subscribe(PLACER_CHANNEL) as subscription:
            async for _channel, _message in subscription:
                woken.set()

    listener = asyncio.create_task(listen(), name="placer-wake")
    try:
        while not stop.is_set():
            woken.clear()  # wake-ups during the pass below trigger the next one at once
            try:
                await asyncio.to_thread(place_pending, ctx)
            except Exception:
                log.exception("placer pass failed")
            if listener.done() and not stop.is_set():
                log.error("placer lost its bus subscription; polling only")
            with contextlib.suppress(TimeoutError):
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(woken.wait())]
                try:
                    await asyncio.wait_for(asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED), interval)
                finally:
                    for w in waits:
                        w.cancel()
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
