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
import json
import logging
import time
from typing import Any

from sqlalchemy import select

from contracts.job_spec import JobSpec
from control_layer.admission import QueueEntry, QueueStrategy, admission_order, blocks_rest, positions
from control_layer.calibration_store import load_calibration
from control_layer.jobs import never_fits, place_job
from control_layer.lifecycle import PLACER_CHANNEL
from control_layer.live_snapshot import current_snapshot
from control_layer.planner.plan_types import Calibration
from control_layer.queue import (
    PassState,
    QueuedRow,
    devices_in_use,
    lowest_active_priorities,
    queued_entries,
    write_queue_state,
)
from control_layer.victim_choice import why_no_preemption
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job
from orchestration.leadership import Deposed

log = logging.getLogger(__name__)

MIN_PASS_GAP_S = 0.25  # between the starts of two passes
SETTLE_QUIET_S = 0.2  # a woken pass waits until wake-ups stop for this long ...
SETTLE_MAX_S = 1.0  # ... but no longer than this after the first

NONE_FREE = "waiting for devices: none is free"
NEVER_CACHE_MAX = 10_000
_UNKNOWN = object()
NeverCache = dict[tuple[Any, str], str | None]  # (fleet capacity, spec) -> why it never fits, or None

# Spec fields the planner never reads: jobs that differ only in these (a burst of one shape with
# a seed each) share one answer to "could it ever fit", instead of planning once per job.
_UNPLANNED = {
    "name": None,
    "data": ("seed",),
    "training": ("lr", "warmup_steps", "weight_decay", "grad_clip", "seed"),
}


def feasibility_key(spec: dict[str, Any], choice: str) -> str:
    """``spec`` and ``choice`` without what the planner never reads, as a cache key."""
    kept: dict[str, Any] = {}
    for field, value in spec.items():
        if field not in _UNPLANNED:
            kept[field] = value
        elif (drop := _UNPLANNED[field]) is not None and isinstance(value, dict):
            kept[field] = {k: v for k, v in value.items() if k not in drop}
    return json.dumps([kept, choice], sort_keys=True)


def place_pending(ctx: ServerContext, never_cache: NeverCache | None = None) -> list[str]:
    """One pass over the queue in admission order (``control_layer.admission``); returns the ids
    of the jobs it tried. After each admission the order is recomputed (fair share moves with the
    devices a tenant holds); at the end every job still queued gets its position.

    Once no device is free, a job is not planned: it waits, unless it could never fit the fleet as
    registered (answered once per spec and fleet capacity, kept in ``never_cache`` across passes),
    in which case ``place_job`` fails it. A pass over a long queue on a full fleet is then one read
    and one write (the positions and reasons that changed)."""
    never_cache = never_cache if never_cache is not None else {}
    with session_scope(ctx.session_factory) as session:
        entries, rows = queued_entries(session)
        if not entries:
            return []
        # read once per pass, not per job: it moves as runs finish and queued tasks start
        calibration = load_calibration(session)
        in_use = devices_in_use(session)
        # with a preemption mechanism, a job above ``lowest`` may displace running work: planned in
        # full; one above only ``lowest_active`` is told why it displaces nothing
        lowest_active, lowest = (
            lowest_active_priorities(session) if ctx.preempt_job is not None else (None, None)
        )
    # A session of its own, used by nothing else: the live snapshot reads in one of its own, and
    # on SQLite a transaction already begun here would hold the lock that read waits for.
    with session_scope(ctx.session_factory) as session:
        snapshot = current_snapshot(ctx, session)
    state = PassState(
        devices_in_use=in_use,
        free_devices=sum(c.n_free for c in snapshot.clusters),
        lowest_active=lowest_active,
        lowest_preemptible=lowest,
    )
    capacity = tuple(sorted((n.id, len(n.devices)) for c in snapshot.clusters for n in c.nodes))
    if len(never_cache) > NEVER_CACHE_MAX:
        never_cache.clear()
    strategy = QueueStrategy(ctx.settings.queue_strategy)
    remaining = admission_order(entries, state.devices_in_use)
    waiting: list[QueueEntry] = []
    reasons: dict[str, str | None] = {}  # reasons decided here, written with the positions
    tried: list[str] = []
    while remaining:
        entry = remaining.pop(0)
        tried.append(entry.job_id)
        start = time.perf_counter()
        outcome = "error"
        try:
            row = rows[entry.job_id]
            may_preempt = lowest is not None and entry.priority > lowest
            full = state.free_devices == 0 and row.attempt == 0 and not may_preempt
            if full and _could_fit(ctx, row, capacity, never_cache, calibration):
                note = why_no_preemption(entry.priority, lowest_active, lowest)
                outcome, reasons[entry.job_id] = "waiting", f"{NONE_FREE}; {note}" if note else NONE_FREE
            if outcome == "error":
                outcome = place_job(ctx, entry.job_id, calibration=calibration, state=state)
        except Deposed:
            raise  # no longer the leader: the next one places the rest
        except Exception:  # one job's failure must not hold up the others
            log.exception("placing job %s failed; it stays queued", entry.job_id)
        ctx.metrics.placements.labels(outcome).observe(time.perf_counter() - start)
        if outcome == "placed":  # fair share moved: the rest in order again
            remaining = admission_order(remaining, state.devices_in_use)
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


def _could_fit(
    ctx: ServerContext,
    row: QueuedRow,
    capacity: tuple[Any, ...],
    never_cache: NeverCache,
    calibration: Calibration,
) -> bool:
    """Whether the job fits the fleet as registered (every device free), answered once per spec
    and fleet capacity. Only asked of first placements: a re-placement avoids nodes."""
    key = (capacity, feasibility_key(row.spec, row.choice))
    never = never_cache.get(key, _UNKNOWN)
    if never is _UNKNOWN:
        spec = JobSpec.model_validate(row.spec)
        never = never_cache[key] = never_fits(ctx, spec, frozenset(), calibration)
    return never is None


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


async def _settle(woken: asyncio.Event, stop: asyncio.Event) -> None:
    """Return once no wake-up came for SETTLE_QUIET_S (at most SETTLE_MAX_S from now), or on stop;
    ``woken`` is left set, so the pass that follows runs at once."""
    until = time.monotonic() + SETTLE_MAX_S
    while not stop.is_set() and (left := until - time.monotonic()) > 0:
        woken.clear()
        try:
            await asyncio.wait_for(woken.wait(), min(SETTLE_QUIET_S, left))
        except TimeoutError:
            break
    woken.set()


async def run_placer(ctx: ServerContext, stop: asyncio.Event, *, interval_s: float | None = None) -> None:
    """Place whenever woken, and at least every ``interval_s``, until ``stop`` is set."""
    interval = interval_s if interval_s is not None else ctx.settings.heartbeat_interval_s
    woken = asyncio.Event()
    never_cache: NeverCache = {}  # whether a spec could ever fit, by fleet capacity

    async def listen() -> None:
        async with ctx.bus.subscribe(PLACER_CHANNEL) as subscription:
            async for _channel, _message in subscription:
                woken.set()

    listener = asyncio.create_task(listen(), name="placer-wake")
    try:
        while not stop.is_set():
            woken.clear()  # wake-ups during the pass below trigger the next one
            began = time.monotonic()
            try:
                await asyncio.to_thread(place_pending, ctx, never_cache)
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
            # A burst of submissions wakes the placer once per stored batch: passes at most every
            # MIN_PASS_GAP_S, each after the burst has settled, leave the CPU to the requests
            # (answering them is what the submitters wait for; a placement a fraction of a second
            # later is not), and each pass takes every job that came.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, began + MIN_PASS_GAP_S - time.monotonic()))
            if woken.is_set():
                await _settle(woken, stop)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
