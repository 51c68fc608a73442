"""What a drain or a revocation does to the jobs on a node.

A drain moves each job running there through ``ctx.preempt_job`` (checkpoint, stop, requeue;
the placer then puts it elsewhere, as the node is cordoned). Where no preemption is wired, the jobs
are left to finish where they run, and the answer says so. A revoked node's tasks are failed like a
lost node's: their jobs are re-placed from their checkpoints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import select

from contracts.states import JOB_ACTIVE, TASK_ACTIVE, TaskState
from control_layer.reactions import on_task_status
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Task

log = logging.getLogger(__name__)

NOT_WIRED = "no preemption is configured: jobs on the node are left to finish there"


@dataclass
class JobsMoved:
    moved: list[str] = field(default_factory=list)  # checkpointed and requeued off the node
    running: list[str] = field(default_factory=list)  # still on it
    note: str = ""


def jobs_on_node(ctx: ServerContext, node_id: str) -> list[str]:
    """Active jobs with an unfinished task of their current attempt on the node, oldest first."""
    with session_scope(ctx.session_factory) as session:
        rows = session.execute(
            select(Job.id)
            .join(Task, Task.job_id == Job.id)
            .where(
                Task.node_id == node_id,
                Task.status.in_(TASK_ACTIVE),
                Task.attempt == Job.attempt,
                Job.status.in_(JOB_ACTIVE),
            )
            .group_by(Job.id, Job.created_at)
            .order_by(Job.created_at, Job.id)
        ).scalars()
        return list(rows)


def move_jobs_off(ctx: ServerContext, node_id: str, reason: str) -> JobsMoved:
    """Preempt every job on a (cordoned) node; one that cannot move now stays, and is named."""
    jobs = jobs_on_node(ctx, node_id)
    if ctx.preempt_job is None:
        return JobsMoved(running=jobs, note=NOT_WIRED if jobs else "")
    out = JobsMoved()
    why = f"node {node_id} drained" + (f": {reason}" if reason else "")
    for job_id in jobs:
        try:
            moved = ctx.preempt_job(ctx, job_id, reason=why)
        except Exception:  # one job's failure must not leave the others unmoved
            log.exception("moving job %s off node %s failed", job_id, node_id)
            moved = False
        (out.moved if moved else out.running).append(job_id)
    if out.running:
        out.note = "some jobs could not be moved now and keep running on the node"
    return out


def fail_revoked_tasks(ctx: ServerContext, node_id: str, reason: str) -> list[str]:
    """Fail the revoked node's unfinished tasks (their jobs are re-placed elsewhere); their ids."""
    with session_scope(ctx.session_factory) as session:
        task_ids = list(
            session.scalars(select(Task.id).where(Task.node_id == node_id, Task.status.in_(TASK_ACTIVE)))
        )
    for task_id in task_ids:  # one transaction per task, as for a lost node: each may re-place its job
        on_task_status(ctx, node_id, task_id, TaskState.FAILED, message=f"node revoked: {reason}")
    return task_ids
