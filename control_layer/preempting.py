"""Preemption on the placer's side: find the running jobs a queued job may displace
(``victim_choice``, pure) and ask the mechanism the context carries (``ctx.preempt_job``) to stop them.

The victims checkpoint, stop and go back to the queue; their devices free up, and the placer's
next pass admits the waiting job.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

from sqlalchemy import select

from contracts.errors import NoFeasiblePlan
from contracts.job_spec import JobSpec
from contracts.states import JOB_ACTIVE
from control_layer.calibration_store import load_calibration
from control_layer.capacity import DeviceKey, with_devices_free
from control_layer.live_snapshot import current_snapshot
from control_layer.planner import plan
from control_layer.planner.plan_types import Calibration
from control_layer.victim_choice import RunningJob, choose_victims
from orchestration.context import ServerContext
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Accelerator, Allocation, Job

log = logging.getLogger(__name__)


def running_jobs(ctx: ServerContext, below_priority: int) -> list[RunningJob]:
    """Active jobs of lower priority with the devices they hold (as (node id, index))."""
    with session_scope(ctx.session_factory) as session:
        rows = session.execute(
            select(
                Job.id,
                Job.priority,
                Job.spec,
                Job.started_at,
                Job.updated_at,
                Accelerator.node_id,
                Accelerator.index,
            )
            .join(Allocation, Allocation.job_id == Job.id)
            .join(Accelerator, Accelerator.id == Allocation.accelerator_id)
            .where(
                Job.status.in_([s.value for s in JOB_ACTIVE]),
                Job.priority < below_priority,
                Allocation.active.is_(True),
            )
        ).all()
    jobs: dict[str, dict] = {}
    for job_id, priority, spec, started, updated, node_id, index in rows:
        entry = jobs.setdefault(
            job_id,
            {
                "priority": priority,
                "preemptible": bool((spec.get("qos") or {}).get("preemptible", False)),
                "started_at": as_utc(started or updated),
                "devices": set(),
            },
        )
        entry["devices"].add((node_id, int(index)))
    return [
        RunningJob(
            job_id=job_id,
            priority=e["priority"],
            preemptible=e["preemptible"],
            devices=frozenset(e["devices"]),
            started_at=e["started_at"],
        )
        for job_id, e in jobs.items()
    ]


def preempt_for(
    ctx: ServerContext,
    job_id: str,
    spec: JobSpec,
    avoid: frozenset[str],
    calibration: Calibration | None,
) -> list[str]:
    """Preempt the victims that let ``job_id`` fit, if any; returns their ids (empty: none)."""
    if ctx.preempt_job is None:
        return []
    running = running_jobs(ctx, spec.qos.priority)
    if not any(r.preemptible for r in running):
        return []
    with session_scope(ctx.session_factory) as session:
        snapshot = current_snapshot(ctx, session, exclude_nodes=avoid)
        if calibration is None:
            calibration = load_calibration(session)

    def fits(freed: frozenset[Hashable]) -> bool:
        keys: set[DeviceKey] = {k for k in freed if isinstance(k, tuple)}
        try:
            plan(spec, with_devices_free(snapshot, keys), calibration)
        except NoFeasiblePlan:
            return False
        return True

    victims = choose_victims(running, spec.qos.priority, fits)
    preempted: list[str] = []
    for victim in victims:
        reason = f"preempted by job {job_id} (priority {spec.qos.priority} > {victim.priority})"
        try:
            # False may mean "already under way" (asked again by a later pass): still a victim
            ctx.preempt_job(ctx, victim.job_id, reason=reason, by_job_id=job_id)
            preempted.append(victim.job_id)
        except Exception:  # one victim's failure leaves the job waiting, not the placer broken
            log.exception("preempting job %s for %s failed", victim.job_id, job_id)
    return preempted
