"""Elastic regions: when a task of a running local_sgd, diloco, gossip, ssp or async job is lost,
the others train on; only the lost task is re-placed, and its replacement starts at the survivors'
step and takes their current model at its first exchange (the sync engine catches a late joiner
up). Sync mode has no such tolerance: its job pauses and resumes from its checkpoints
(``reactions._task_failed`` re-places the whole attempt). Every case is an event on the job.

Runs inside the caller's transaction, with the job row locked.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.job_spec import JobSpec
from contracts.states import TASK_ACTIVE, TaskState
from control_layer.allocation import AllocationConflict, allocate_replacement, release
from control_layer.checkpoint_copies import reachable_checkpoints
from control_layer.checkpoints import job_checkpoints
from control_layer.dispatch import dispatch, send_cancel, send_peer_lost
from control_layer.lifecycle import wake_placer
from control_layer.planner.replacement import pick_replacement
from control_layer.snapshot import build_snapshot
from control_layer.task_states import move_task
from control_layer.worker_config import TaskSlot
from orchestration.context import ServerContext
from orchestration.db.models import Accelerator, Job, Task
from orchestration.events import record_event

log = logging.getLogger(__name__)

ELASTIC_MODES = ("local_sgd", "diloco", "gossip", "ssp", "async")


def participant(task: Task) -> str:
    return str((task.worker_config or {}).get("region") or task.region)


def elastic_refusal(mode: str, tasks: list[Task], lost: Task, max_drops: int) -> str | None:
    """Why losing ``lost`` must stop the whole attempt, or None when the others can go on.
    ``tasks`` are the attempt's tasks that were not dropped before (``lost`` among them)."""
    if mode not in ELASTIC_MODES:
        return f"mode {mode} exchanges every step in lockstep"
    if (lost.worker_config or {}).get("group"):
        # Its group's other nodes lose their ranks with it, and a group only starts as a whole.
        return "it ran part of a torchrun group spanning nodes, which resumes as a whole from its checkpoint"
    others = [t for t in tasks if t.id != lost.id]
    # Others that finished hold the job's model: it ends without the lost task (``_replace`` drops it).
    if not any(t.status in TASK_ACTIVE or t.status == TaskState.SUCCEEDED for t in others):
        return "no other task is still training or has finished"
    names = sorted({participant(t) for t in tasks})
    ps = (lost.worker_config.get("sync") or {}).get("ps_region") or names[0]
    if mode == "async" and participant(lost) == ps:
        return "it was the parameter server, which holds the model"
    if max_drops < 1:
        return "no retries are allowed"
    return None


def handle_lost_task(ctx: ServerContext, session: Session, job: Job, lost: Task, what: str) -> bool:
    """Keep the job going without ``lost`` when its mode allows; True when handled here (the job's
    other tasks keep running), False when the caller must stop the attempt."""
    try:
        spec = JobSpec.model_validate(job.spec)
    except ValidationError:
        return False  # a job stored without a spec the planner understands: stop it the usual way
    tasks = list(
        session.scalars(
            select(Task).where(Task.job_id == job.id, Task.attempt == job.attempt, Task.dropped.is_(False))
        )
    )
    dropped = session.scalar(
        select(func.count())
        .select_from(Task)
        .where(Task.job_id == job.id, Task.attempt == job.attempt, Task.dropped.is_(True))
    )
    # Each lost task spends one of the job's retries, as a whole re-placement would.
    budget = ctx.settings.max_job_retries - (job.attempt - 1 - job.preemptions) - int(dropped or 0)
    refusal = elastic_refusal(spec.sync.mode, tasks, lost, budget)
    if refusal is not None:
        if len(tasks) > 1:
            record_event(
                session,
                ctx.bus,
                "job.paused",
                job.id,
                {
                    "participant": participant(lost),
                    "task_id": lost.id,
                    "why": refusal,
                    "resume_from": job_checkpoints(session, job.id),
                },
            )
        return False
    key = participant(lost)
    lost.dropped = True
    release(session, job.id, [lost.id])
    wake_placer(session, ctx.bus, "devices released", job.id)
    record_event(
        session,
        ctx.bus,
        "job.region_lost",
        job.id,
        {
            "participant": key,
            "task_id": lost.id,
            "node_id": lost.node_id,
            "region": lost.region,
            "reason": what,
        },
    )
    others = [t for t in tasks if t.id != lost.id]
    for t in others:
        if t.status in TASK_ACTIVE:
            send_peer_lost(session, ctx.bus, t, lost, key, what)
    replacement = _replace(ctx, session, job, spec, lost, others)
    if isinstance(replacement, str):
        record_event(
            session,
            ctx.bus,
            "job.region_dropped",
            job.id,
            {"participant": key, "task_id": lost.id, "why": replacement},
        )
    return True


def drop_stranded_replacements(ctx: ServerContext, session: Session, job: Job, tasks: list[Task]) -> None:
    """Once every other task has finished, a replacement that has not trained a step since it
    started can meet no peer: it would wait out its start-up timeout and then train the rest of the
    run alone, while the job's model is the finished tasks' one. Cancel and drop it.
    ``tasks``: the attempt's tasks that were not dropped before."""
    active = [t for t in tasks if t.status in TASK_ACTIVE]
    if not active or any(t.status != TaskState.SUCCEEDED for t in tasks if t.status not in TASK_ACTIVE):
        return
    if not all(_stranded(t) for t in active):
        return
    why = "the others finished before it met them; they finish without it"
    for t in active:
        t.dropped = True
        move_task(t, TaskState.CANCELLED, message=why)
        send_cancel(session, ctx.bus, t, why)
        record_event(
            session,
            ctx.bus,
            "job.region_dropped",
            job.id,
            {"participant": participant(t), "task_id": t.id, "why": why},
        )
    release(session, job.id, [t.id for t in active])
    wake_placer(session, ctx.bus, "devices released", job.id)


def _stranded(task: Task) -> bool:
    """A replacement (it has a start step) that has reported no step after it."""
    start = ((task.worker_config or {}).get("checkpoint") or {}).get("start_step")
    step = (task.last_metrics or {}).get("step")
    return isinstance(start, int) and start > 0 and not (isinstance(step, int) and step > start)


def _job_step(metrics: dict) -> int | float | None:
    """How far a task is on the job's step axis: its step, unless balanced rounds give its region
    a step count of its own (a fast region passes ``training.steps`` before the job ends)."""
    at = metrics.get("job_step")
    return at if isinstance(at, int | float) else metrics.get("step")


def _replace(
    ctx: ServerContext, session: Session, job: Job, spec: JobSpec, lost: Task, others: list[Task]
) -> Task | str:
    """The lost task's replacement, dispatched; or why there is none."""
    if ((lost.worker_config or {}).get("sync") or {}).get("stages"):
        # Each of its stages' rings would need a port on the new node and the survivors a new peer
        # address per ring, which a running worker does not take: the rings go on without it.
        return "its job syncs per pipeline stage; the others go on without it"
    steps = spec.training.steps
    survivors_at = [
        int(s)
        for t in others
        if isinstance(s := _job_step(t.last_metrics or {}), int | float) and t.status in TASK_ACTIVE
    ] + [steps for t in others if t.status == "succeeded"]
    if max(survivors_at, default=0) >= steps:
        # A replacement could only start from scratch and train the whole run alone.
        return "the others are at their last step; they finish without it"
    failed_nodes = set(
        session.scalars(select(Task.node_id).where(Task.job_id == job.id, Task.status == "failed"))
    )
    busy_nodes = {t.node_id for t in others if t.status in TASK_ACTIVE}
    kinds = frozenset(
        session.scalars(
            select(Accelerator.kind).where(
                Accelerator.node_id == lost.node_id, Accelerator.index.in_(list(lost.device_indices))
            )
        )
    ) or frozenset({"cpu", "cuda"})
    snapshot = build_snapshot(session, exclude_nodes=failed_nodes | busy_nodes | {lost.node_id})
    pick = pick_replacement(
        spec,
        snapshot,
        devices=len(lost.device_indices),
        kinds=kinds,
        prefer_region=lost.region,
        exclude_nodes=frozenset(failed_nodes | busy_nodes | {lost.node_id}),
    )
    if pick is None:
        return "no node can take its place; the others go on"
    start = max(survivors_at, default=0)
    if not start:
        done = [int(c["step"]) for c in job_checkpoints(session, job.id).values()]
        start = min(done, default=0)
    start_step = start if 0 < start < steps else None
    peers = {participant(t): (t.worker_config.get("sync") or {}).get("listen") for t in others}
    # Copies of the lost task's checkpoints on other nodes of its region (checkpoint_copies).
    held = reachable_checkpoints(session, job.id).get(participant(lost), {}).get("holders") or []

    def configure(slot: TaskSlot) -> dict[str, Any]:
        cfg = copy.deepcopy(lost.worker_config)
        cfg["cluster"] = slot.cluster_name
        sync = cfg.get("sync") or {}
        if slot.listen:
            sync["listen"] = sync["advertise"] = slot.listen
        # The survivors' addresses as they are now (one of them may itself be a replacement).
        sync["peers"] = {k: v for k, v in (sync.get("peers") or {}).items()} | {
            k: v for k, v in peers.items() if v
        }
        cfg["sync"] = sync
        # A copy of its checkpoint on the new node serves only if it is not behind the survivors
        # (their current model loses fewer steps); the lost task's fetch ticket is spent.
        here = max((int(h["step"]) for h in held if h["node_id"] == slot.node_id), default=0)
        cfg["checkpoint"] = (cfg.get("checkpoint") or {}) | {
            "start_step": start_step,
            "fetch": None,
            "resume": start_step is None or here >= start_step,
        }
        return cfg

    try:
        with session.begin_nested():
            task = allocate_replacement(session, job, lost, pick.node_id, pick.devices, configure)
    except AllocationConflict as exc:
        log.info("job %s: replacement of task %s collided (%s)", job.id, lost.id, exc.message)
        return "no node can take its place now (its devices were taken); the others go on"
    dispatch(session, ctx.bus, task)
    record_event(
        session,
        ctx.bus,
        "job.region_replaced",
        job.id,
        {
            "participant": participant(lost),
            "lost_task_id": lost.id,
            "task_id": task.id,
            "node_id": task.node_id,
            "region": task.region,
            "start_step": start_step,
        },
    )
    return task
