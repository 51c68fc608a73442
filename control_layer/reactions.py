"""How the control plane reacts to what nodes report (called by the gRPC servicer, synchronously).

Every reaction about a job first locks the job's row, so reports from its tasks are applied one
at a time and "all tasks succeeded" is decided on fresh data. Reports that arrive late, repeat,
or belong to an attempt the job has moved past are recorded but change nothing; a node still
running such a task is told to cancel it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument, NotFound, PermissionDenied
from contracts.states import (
    JOB_ACTIVE,
    JOB_TERMINAL,
    TASK_ACTIVE,
    TASK_TERMINAL,
    JobState,
    TaskState,
    task_move_applies,
)
from control_layer import preemption
from control_layer.calibration import TIMING_KEYS
from control_layer.calibration_store import on_task_start
from control_layer.checkpoint_copies import order_copy, record_copy_result
from control_layer.checkpoints import share_with_group
from control_layer.dispatch import assignment_message, send_cancel
from control_layer.elastic import drop_stranded_replacements, handle_lost_task
from control_layer.lifecycle import transition
from control_layer.task_states import clip_message, move_task, normalize_task_state
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Node, Task, TaskMetric
from orchestration.events import job_channel, publish_after_commit, record_event
from orchestration.ledger import meter_tasks
from resource_layer.handlers import ControlHandlers

log = logging.getLogger(__name__)


def on_task_status(
    ctx: ServerContext,
    node_id: str,
    assignment_id: str,
    state: str,
    message: str = "",
    exit_code: int | None = None,
    result: dict[str, Any] | None = None,
    lost: bool = False,
) -> None:
    """Apply a task's reported state and move the job along (back to the queue after a failure,
    where the placer picks it up). ``lost``: a FAILED task its node's scheduler took away."""
    to = normalize_task_state(state)
    with session_scope(ctx.session_factory) as session:
        job_id = session.scalar(select(Task.job_id).where(Task.id == assignment_id))
        if job_id is None:
            raise NotFound(f"no task {assignment_id}", field="assignment_id")
        job = _lock_job(session, job_id)
        task = session.get(Task, assignment_id, populate_existing=True)
        assert task is not None
        if task.node_id != node_id:
            raise PermissionDenied(
                f"task {assignment_id} is not assigned to node {node_id}", field="assignment_id"
            )

        if to == task.status == TaskState.STARTING and message and clip_message(message) != task.message:
            # Progress while the agent stages (``staging data 45% ...``): the task stays starting,
            # its message and the job's events follow.
            task.message = clip_message(message)
            record_event(
                session,
                ctx.bus,
                "task.progress",
                job.id,
                {"task_id": task.id, "node_id": node_id, "region": task.region, "message": task.message},
            )
            return
        if not task_move_applies(task.status, to):
            if to in _LIVE and task.status in (TaskState.FAILED, TaskState.CANCELLED):
                send_cancel(session, ctx.bus, task, f"task is already {task.status}")
            return
        move_task(task, to, message=message, exit_code=exit_code, result=_finite(result))
        _note_checkpoint(session, task, (result or {}).get("checkpoint_step"))
        if to is TaskState.RUNNING and result:
            _learn_queue_wait(session, ctx, task)
        if to in TASK_TERMINAL and job.status not in JOB_TERMINAL:
            meter_tasks(session, job, [task])  # metering closes at the task's end
        record_event(
            session,
            ctx.bus,
            f"task.{to}",
            job.id,
            {
                "task_id": task.id,
                "node_id": node_id,
                "region": task.region,
                "attempt": task.attempt,
                "message": task.message,
                "exit_code": exit_code,
            }
            | ({"lost": True} if lost and to is TaskState.FAILED else {}),
        )
        if task.attempt != job.attempt or job.status not in JOB_ACTIVE:
            if to in _LIVE:
                send_cancel(session, ctx.bus, task, f"job {job.id} is {job.status} (attempt {job.attempt})")
            return
        if to is TaskState.RUNNING:
            _maybe_running(ctx, session, job)
        elif to is TaskState.SUCCEEDED:
            _maybe_succeeded(ctx, session, job)
            preemption.on_task_ended(ctx, session, job)  # the others may have stopped preempted
        elif to in (TaskState.FAILED, TaskState.CANCELLED):
            if job.preemption:  # stopped while the job is preempted: it requeues as a whole
                preemption.on_task_ended(ctx, session, job)
            else:
                _task_failed(ctx, session, job, task, lost=lost and to is TaskState.FAILED)


_LIVE = (TaskState.STARTING, TaskState.RUNNING)


def _learn_queue_wait(session: Session, ctx: ServerContext, task: Task) -> None:
    """A scheduler-backed task started: its node's queue wait is learned now, in a savepoint (a
    failure to learn must not refuse the report, which its agent would resend forever)."""
    try:
        with session.begin_nested():
            on_task_start(session, task)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the task's start must still commit
        log.exception("task %s: calibration from its start failed", task.id)
        record_event(
            session,
            ctx.bus,
            "task.calibration_failed",
            task.job_id,
            {"task_id": task.id, "error": clip_message(repr(exc))},
        )


def _attempt_tasks(session: Session, job: Job) -> list[Task]:
    return list(
        session.scalars(
            select(Task)
            .where(Task.job_id == job.id, Task.attempt == job.attempt, Task.dropped.is_(False))
            .order_by(Task.id)
        )
    )


def _maybe_running(ctx: ServerContext, session: Session, job: Job) -> None:
    tasks = _attempt_tasks(session, job)
    if job.status == JobState.PLACED and all(
        t.status in (TaskState.RUNNING, TaskState.SUCCEEDED) for t in tasks
    ):
        transition(session, ctx.bus, job, JobState.RUNNING)


def _maybe_succeeded(ctx: ServerContext, session: Session, job: Job) -> None:
    drop_stranded_replacements(ctx, session, job, _attempt_tasks(session, job))
    tasks = _attempt_tasks(session, job)
    if not all(t.status == TaskState.SUCCEEDED for t in tasks):
        _maybe_running(ctx, session, job)
        return
    if job.status == JobState.PLACED:
        transition(session, ctx.bus, job, JobState.RUNNING)
    job.result = aggregate_results(tasks)
    transition(session, ctx.bus, job, JobState.SUCCEEDED, reason="")


def lost_with_progress(task: Task) -> bool:
    """Whether a lost task (its scheduler preempted it, its node failed, its time ran out) wrote a
    checkpoint past the step it started from: its re-placement resumes further on."""
    start = ((task.worker_config or {}).get("checkpoint") or {}).get("start_step") or 0
    return isinstance(start, int) and (task.checkpoint_step or 0) > start


def _task_failed(ctx: ServerContext, session: Session, job: Job, task: Task, *, lost: bool = False) -> None:
    """An elastic job goes on without the task (``control_layer.elastic``); otherwise stop the
    attempt: back to the queue for the placer while retries remain, else failed. A ``lost`` task
    that checkpointed past its start re-places the attempt without spending a retry (counted with
    the job's preemptions): the cluster took it away, and each such re-placement moves the job on,
    so they end."""
    what = f"task {task.id} on node {task.node_id} ({task.region}) {'lost' if lost else task.status}"
    if task.message:
        what += f": {task.message}"
    if task.exit_code is not None:
        what += f" (exit code {task.exit_code})"
    if handle_lost_task(ctx, session, job, task, what):
        _maybe_succeeded(ctx, session, job)  # the others may all have finished already
        return
    if lost and lost_with_progress(task):
        job.preemptions = (job.preemptions or 0) + 1
        reason = f"{what}; re-placing from its checkpoint of step {task.checkpoint_step} (no retry spent)"
        transition(
            session, ctx.bus, job, JobState.QUEUED, reason=reason, tasks_note=f"stopped because {what}"
        )
        return
    retries_used = job.attempt - 1 - job.preemptions  # a re-placement after a preemption is no retry
    limit = ctx.settings.max_job_retries
    if retries_used < limit:
        reason = f"{what}; re-placing (retry {retries_used + 1} of {limit})"
        transition(
            session, ctx.bus, job, JobState.QUEUED, reason=reason, tasks_note=f"stopped because {what}"
        )
    else:
        reason = f"{what}; gave up after {job.attempt} attempt(s)"
        transition(
            session, ctx.bus, job, JobState.FAILED, reason=reason, tasks_note=f"stopped because {what}"
        )


_SUM_KEYS = ("wan_bytes_sent", "wan_bytes_recv", "wan_wire_bytes_sent", "tokens")
_MAX_KEYS = ("wall_time_s", "wall_s", "duration_s", "steps", "step")


def aggregate_results(tasks: list[Task]) -> dict[str, Any]:
    """One job result from its tasks' results: numbers averaged by replica count (byte and token
    counts summed, and left out unless every task has them; times and step counts maxed), anything
    else taken from the first replica's task;
    each task's own result is kept under ``per_task``."""
    ordered = sorted(
        tasks, key=lambda t: ((t.worker_config.get("sync") or {}).get("replica_offset", 0), t.id)
    )
    results = [(t, t.result or {}) for t in ordered]
    weights = [float((t.worker_config.get("parallel") or {}).get("dp_local", 1)) for t in ordered]
    merged: dict[str, Any] = {}
    keys = [k for _, r in results for k in r]
    for key in dict.fromkeys(keys):
        values = [r[key] for _, r in results if key in r]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if key in _SUM_KEYS and len(values) != len(results):
            continue  # a sum over some tasks is no total (e.g. wire bytes a kernel could not read)
        if numeric and len(values) == len(results):
            if key in _SUM_KEYS:
                merged[key] = sum(values)
            elif key in _MAX_KEYS:
                merged[key] = max(values)
            else:
                merged[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
        else:
            merged[key] = values[0]
    merged["per_task"] = {t.id: {"region": t.region, "node_id": t.node_id, **r} for t, r in results}
    return merged


def on_task_metrics(ctx: ServerContext, node_id: str, assignment_id: str, metrics: dict[str, Any]) -> None:
    """Store one step's metrics, keep them as the task's latest, and publish them on the job channel.
    Metrics of a step no newer than the latest stored are ignored (agents replay on reconnect)."""
    step = metrics.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise InvalidArgument(
            f"metrics.step must be a non-negative integer, got {step!r}", field="metrics.step"
        )
    spread = metrics.get("gossip_spread")
    if spread is not None and not (
        isinstance(spread, int | float) and not isinstance(spread, bool) and 0 <= spread < math.inf
    ):
        raise InvalidArgument(
            f"metrics.gossip_spread must be a finite non-negative number, got {spread!r}",
            field="metrics.gossip_spread",
        )
    job_step = metrics.get("job_step")
    if job_step is not None and not (
        isinstance(job_step, int | float) and not isinstance(job_step, bool) and 0 <= job_step < math.inf
    ):
        raise InvalidArgument(
            f"metrics.job_step must be a finite non-negative number, got {job_step!r}",
            field="metrics.job_step",
        )
    clean = _finite(metrics)
    with session_scope(ctx.session_factory) as session:
        job_id = session.scalar(select(Task.job_id).where(Task.id == assignment_id))
        if job_id is None:
            raise NotFound(f"no task {assignment_id}", field="assignment_id")
        # Lock order job -> task, as in on_task_status: the metric row's foreign key takes a share
        # lock on the job, and taking it after the task row would deadlock with a status change.
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update(read=True, key_share=True))
        task = session.get(Task, assignment_id)
        assert task is not None
        if task.node_id != node_id:
            raise PermissionDenied(
                f"task {assignment_id} is not assigned to node {node_id}", field="assignment_id"
            )
        last = (task.last_metrics or {}).get("step")
        if isinstance(last, int) and step <= last:
            return  # a worker reports each step once: this is a replay after a reconnect, or late
        session.add(
            TaskMetric(
                job_id=task.job_id,
                task_id=task.id,
                region=task.region,
                step=step,
                loss=_float_or_none(clean.get("loss")),
                tokens_per_s=_float_or_none(clean.get("tokens_per_s")) or 0.0,
                compute_utilization=_float_or_none(clean.get("compute_utilization")) or 0.0,
                wan_bytes_sent=int(clean.get("wan_bytes_sent") or 0),
                wan_bytes_recv=int(clean.get("wan_bytes_recv") or 0),
                timings=_timings(clean),
                gossip_spread=_float_or_none(clean.get("gossip_spread")),
            )
        )
        task.last_metrics = clean
        before = task.checkpoint_step
        _note_checkpoint(session, task, clean.get("checkpoint_step"))
        if task.checkpoint_step != before and task.status in TASK_ACTIVE:
            # A newer complete checkpoint: keep a copy on another node of the region, off the
            # task's critical path (the agents copy in the background).
            order_copy(ctx, session, task)
        publish_after_commit(
            session,
            ctx.bus,
            job_channel(task.job_id),
            {
                "kind": "task.metrics",
                "job_id": task.job_id,
                "task_id": task.id,
                "region": task.region,
                "metrics": clean,
            },
        )


def on_node_lost(ctx: ServerContext, node_id: str, reason: str) -> list[str]:
    """Mark the node lost and fail its unfinished tasks ("node lost"); returns those task ids."""
    with session_scope(ctx.session_factory) as session:
        node = session.scalars(select(Node).where(Node.id == node_id).with_for_update()).one_or_none()
        if node is None:
            raise NotFound(f"node {node_id} not found", field="node_id")
        node.status = "lost"
        record_event(session, ctx.bus, "node.lost", None, {"node_id": node_id, "reason": reason})
        task_ids = list(
            session.scalars(select(Task.id).where(Task.node_id == node_id, Task.status.in_(TASK_ACTIVE)))
        )
    for task_id in task_ids:  # one transaction per task: each may re-place its job
        on_task_status(ctx, node_id, task_id, TaskState.FAILED, message=f"node lost: {reason}")
    return task_ids


def pending_assignments(ctx: ServerContext, node_id: str) -> list[dict[str, Any]]:
    """Assignments a (re)connecting node should be running: its unfinished tasks of live attempts."""
    with session_scope(ctx.session_factory) as session:
        rows = session.execute(
            select(Task)
            .join(Job, Job.id == Task.job_id)
            .where(
                Task.node_id == node_id,
                Task.status.in_(TASK_ACTIVE),
                Task.attempt == Job.attempt,
                Job.status.in_(JOB_ACTIVE),
            )
            .order_by(Task.created_at, Task.id)
        ).scalars()
        return [assignment_message(t) for t in rows]


def _note_checkpoint(session: Session, task: Task, step: Any) -> None:
    """Keep the newest complete checkpoint a task reported (0 or nothing: none yet), on the other
    nodes of its group too where it spans nodes."""
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        task.checkpoint_step = max(step, task.checkpoint_step or 0)
        share_with_group(session, task)


def _lock_job(session: Session, job_id: str) -> Job:
    return session.scalars(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).one()


def _timings(metrics: dict[str, Any]) -> dict[str, float] | None:
    """The step's time by part, for calibration; None from a worker that reports no parts."""
    # The agent sends the step's wall time as step_wall_s (wall_s from a worker's own lines).
    named = {**metrics, "wall_s": metrics.get("step_wall_s", metrics.get("wall_s"))}
    parts = {k: v for k in TIMING_KEYS if (v := _float_or_none(named.get(k))) is not None}
    return parts or None


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _finite(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None (PostgreSQL's json type refuses them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def control_handlers() -> ControlHandlers:
    """The reactions the resource layer's gRPC edge calls, for the composition root to register."""
    return ControlHandlers(
        on_task_status=on_task_status,
        on_task_metrics=on_task_metrics,
        pending_assignments=pending_assignments,
        on_checkpoint_copy_result=on_checkpoint_copy_result,
    )


def on_checkpoint_copy_result(ctx: ServerContext, node_id: str, result: dict[str, Any]) -> None:
    """Record how a node's checkpoint copy (or fetch before a launch) went."""
    with session_scope(ctx.session_factory) as session:
        record_copy_result(ctx, session, node_id, result)
