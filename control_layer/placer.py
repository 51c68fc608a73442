"""The placer: admits queued jobs, off the request path.

Submission stores a job as queued and wakes the placer on the bus (``lifecycle.PLACER_CHANNEL``);
so does a job going back to the queue after a failure and any release of devices. The placer also
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

from control_layer.admission import QueueEntry, QueueStrategy, admission_order, blocks_rest, positions
from control_layer.calibration_store import load_calibration
from control_layer.jobs import place_job
from control_layer.lifecycle import PLACER_CHANNEL
from control_layer.queue import PassState, devices_in_use, queued_entries, write_queue_state
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job
from orchestration.leadership import Deposed

log = logging.getLogger(__name__)


def place_pending(ctx: ServerContext) -> list[str]:
    """One pass over the queue in admission order (``control_layer.admission``); returns the ids
    of the jobs it tried. After each admission the order is recomputed (fair share moves with the
    devices a tenant holds); at the end every job still queued gets its position."""
    with session_scope(ctx.session_factory) as session:
        entries = queued_entries(session)
        # read once per pass, not per job: it moves only when runs finish
        calibration = load_calibration(session) if entries else None
        state = PassState(devices_in_use=devices_in_use(session) if entries else {})
    if not entries:
        return []
    strategy = QueueStrategy(ctx.settings.queue_strategy)
    remaining = list(entries)
    waiting: list[QueueEntry] = []
    reasons: dict[str, str | None] = {}
    tried: list[str] = []
    while remaining:
        entry = admission_order(remaining, state.devices_in_use)[0]
        remaining.remove(entry)
        tried.append(entry.job_id)
        start = time.perf_counter()
        outcome = "error"
        try:
            outcome = place_job(ctx, entry.job_id, calibration=calibration, state=state)
        except Deposed:
            raise  # no longer the leader: the next one places the rest
        except Exception:  # one job's failure must not hold up the others
            log.exception("placing job %s failed; it stays queued", entry.job_id)
        ctx.metrics.placements.labels(outcome).observe(time.perf_counter() - start)
        if outcome in ("waiting", "quota", "deferred", "error"):
            waiting.append(entry)
        if blocks_rest(strategy, outcome == "waiting"):
            held = (
                f"behind job {entry.job_id} ({strategy.value}: the first job waiting for devices goes first)"
            )
            waiting.extend(remaining)
            reasons.update({e.job_id: held for e in remaining})
            break
    _record_positions(ctx, waiting, state, reasons)
    return tried


def _record_positions(
    ctx: ServerContext, waiting: list[QueueEntry], state: PassState, held: dict[str, str | None]
) -> None:
    if not waiting:
        return
    order = admission_order(waiting, state.devices_in_use)
    with session_scope(ctx.session_factory) as session:
        ids = [e.job_id for e in order]
        current = {i: r for i, r in session.execute(select(Job.id, Job.deferred).where(Job.id.in_(ids)))}
        reasons = {e.job_id: held.get(e.job_id, current.get(e.job_id)) for e in order}
        write_queue_state(session, positions(order), reasons)


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
