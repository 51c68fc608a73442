"""Preemption: a running job checkpoints where it is, stops, and goes back to the queue, to resume
from that checkpoint when it is placed again.

``preempt_job`` records the request on the job (``Job.preemption``) and orders each of the
attempt's active tasks to checkpoint and stop (``Preempt`` on its node's stream; the workers save
at their next step boundary, ``training.preemption``). The job keeps its devices until its tasks
have stopped: neither its re-placement nor the job that preempted it starts on devices a worker
still uses, and the re-placement finds the checkpoint complete. Each task's end arrives through
``reactions.on_task_status``, which records the checkpoint step it reports and hands the job here;
once none is active the job goes back to the queue (``settle``). That is not a failed attempt
(``Job.preemptions`` is not counted against the retries), and a ``job.preempted`` event names who
preempted it, why, and where each participant resumes. The re-placement takes the latest complete
checkpoints like any other (``worker_config._checkpoint``, fetched from the old node if it lands
elsewhere). A task that finished its last step first ends the job as it would have anyway. A task
still active at the request's deadline (the agent's grace plus a margin: its node may be gone) is
cancelled by ``expire_preemptions``, and the job resumes from its last complete checkpoint. The
ledger charges every task's device time up to its end, over all attempts.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, InvalidArgument, NotFound
from contracts.states import JOB_ACTIVE, TASK_ACTIVE, JobState
from control_layer.checkpoints import job_checkpoints
from control_layer.dispatch import send_preempt
from control_layer.lifecycle import transition
from control_layer.task_states import clip_message
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Task
from orchestration.events import record_event

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0  # for the workers to finish their step, write the checkpoint and exit
MAX_GRACE_S = 600.0
# Past the grace: the agent's own SIGTERM-to-SIGKILL wait and the report's way up. A node that says
# nothing by then is taken to be gone with its workers.
DEADLINE_MARGIN_S = 30.0
REASON_LIMIT = 500


def preemption_refusal(status: str, spec: dict[str, Any], underway: bool) -> str | None:
    """Why a job in ``status`` with ``spec`` cannot be preempted now, or None. Pure."""
    if not bool(((spec or {}).get("qos") or {}).get("preemptible")):
        return "its spec does not allow preemption (qos.preemptible is false)"
    if status not in JOB_ACTIVE:
        return f"it is {status}: only a placed or running job can be preempted"
    if underway:
        return "it is already being preempted"
    return None


def preempt_job(
    ctx: ServerContext,
    job_id: str,
    *,
    reason: str,
    by_job_id: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> bool:
    """Preempt a running (or placed) preemptible job: its tasks checkpoint and stop, then it goes
    back to the queue and resumes from those checkpoints when placed again. False, changing
    nothing, when the job is not preemptible, not active, or already being preempted."""
    try:
        request_preemption(ctx, job_id, reason=reason, by_job_id=by_job_id, grace_s=grace_s)
    except FailedPrecondition as exc:
        log.info("job %s not preempted: %s", job_id, exc.message)
        return False
    return True


def request_preemption(
    ctx: ServerContext,
    job_id: str,
    *,
    reason: str,
    by_job_id: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> Job:
    """``preempt_job``, raising FailedPrecondition (with the reason) where it would return False;
    NotFound for an unknown job, InvalidArgument for a bad reason or grace."""
    with session_scope(ctx.session_factory) as session:
        return start_preemption(ctx, session, job_id, reason=reason, by_job_id=by_job_id, grace_s=grace_s)


def start_preemption(
    ctx: ServerContext,
    session: Session,
    job_id: str,
    *,
    reason: str,
    by_job_id: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> Job:
    """``request_preemption`` in the caller's transaction (the orders go out after its commit)."""
    reason = reason.strip()
    if not reason or len(reason) > REASON_LIMIT:
        raise InvalidArgument(f"reason: 1 to {REASON_LIMIT} characters", field="reason")
    if not (math.isfinite(grace_s) and 0 < grace_s <= MAX_GRACE_S):
        raise InvalidArgument(f"grace_s must be in (0, {MAX_GRACE_S:g}], got {grace_s!r}", field="grace_s")
    if by_job_id == job_id:
        raise InvalidArgument("a job cannot preempt itself", field="by_job_id")
    job = _lock_job(session, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found", field="job_id")
    refusal = preemption_refusal(job.status, job.spec, bool(job.preemption))
    if refusal is not None:
        raise FailedPrecondition(
            f"job {job_id} cannot be preempted: {refusal}", job_id=job_id, status=job.status
        )
    now = utcnow()
    job.preemption = {
        "reason": reason,
        "by_job_id": by_job_id,
        "grace_s": grace_s,
        "requested_at": now.isoformat(),
        "deadline_at": (now + timedelta(seconds=grace_s + DEADLINE_MARGIN_S)).isoformat(),
    }
    tasks = [t for t in _attempt_tasks(session, job) if t.status in TASK_ACTIVE]
    record_event(
        session,
        ctx.bus,
        "job.preempting",
        job.id,
        {"by_job_id": by_job_id, "reason": reason, "grace_s": grace_s, "tasks": [t.id for t in tasks]},
    )
    for task in tasks:
        send_preempt(session, ctx.bus, task, reason, grace_s)
    if not tasks:  # nothing to wait for (every task already ended; its report is being applied)
        settle(ctx, session, job)
    return job


def on_task_ended(ctx: ServerContext, session: Session, job: Job) -> None:
    """A task of the current attempt of a job under preemption has ended (job row locked): once
    none is active, the job goes back to the queue. All of them succeeded: the job has ended as
    it would have anyway (the caller finished it)."""
    if job.status not in JOB_ACTIVE or not job.preemption:
        return
    tasks = _attempt_tasks(session, job)
    if any(t.status in TASK_ACTIVE for t in tasks):
        return
    settle(ctx, session, job)


def settle(ctx: ServerContext, session: Session, job: Job, *, late: str | None = None) -> None:
    """Back to the queue after a preemption, with its ``job.preempted`` event; ``late``: why the
    tasks still active are cancelled now (the deadline passed)."""
    request = dict(job.preemption or {})
    tasks = _attempt_tasks(session, job)
    stopped = {
        t.id: {
            "region": t.region,
            "node_id": t.node_id,
            "status": "cancelled (late)" if t.status in TASK_ACTIVE else t.status,
            "step": (t.last_metrics or {}).get("step"),
            "checkpoint_step": t.checkpoint_step,
        }
        for t in tasks
    }
    by_job_id = request.get("by_job_id")
    reason = str(request.get("reason") or "preempted")
    job.preemptions = (job.preemptions or 0) + 1
    record_event(
        session,
        ctx.bus,
        "job.preempted",
        job.id,
        {
            "by_job_id": by_job_id,
            "reason": reason,
            "attempt": job.attempt,
            "tasks": stopped,
            "resume_from": job_checkpoints(session, job.id),
            **({"late": late} if late else {}),
        },
    )
    by = f" by job {by_job_id}" if by_job_id else ""
    transition(
        session,
        ctx.bus,
        job,
        JobState.PENDING,
        reason=clip_message(f"preempted{by}: {reason}"),
        payload={"preempted": True, "by_job_id": by_job_id},
        tasks_note=late or f"preempted{by}",
    )


def expire_preemptions(ctx: ServerContext, now: datetime | None = None) -> list[str]:
    """Requeue the jobs whose preemption passed its deadline with tasks still active (their nodes
    never answered, or the agents' own cancel never reported back); returns their ids."""
    now = now or utcnow()
    with session_scope(ctx.session_factory) as session:
        rows = session.execute(select(Job.id, Job.preemption).where(Job.status.in_(list(JOB_ACTIVE)))).all()
    due = [job_id for job_id, p in rows if p and _deadline(p) <= now]
    expired = []
    for job_id in due:  # one transaction per job
        with session_scope(ctx.session_factory) as session:
            job = _lock_job(session, job_id)
            if job is None or job.status not in JOB_ACTIVE or not job.preemption:
                continue
            if _deadline(job.preemption) > now:
                continue
            grace = float(job.preemption.get("grace_s") or 0.0)
            late = f"did not stop within {grace:g}s (+{DEADLINE_MARGIN_S:g}s) of being preempted"
            log.warning("job %s: preempted tasks %s; cancelling them", job_id, late)
            settle(ctx, session, job, late=late)
            expired.append(job_id)
    return expired


def _deadline(request: dict[str, Any]) -> datetime:
    try:
        return datetime.fromisoformat(str(request["deadline_at"]))
    except (KeyError, ValueError):
        return datetime.min.replace(tzinfo=utcnow().tzinfo)  # unreadable: due now


def _lock_job(session: Session, job_id: str) -> Job | None:
    return session.scalars(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).one_or_none()


def _attempt_tasks(session: Session, job: Job) -> list[Task]:
    return list(
        session.scalars(
            select(Task)
            .where(Task.job_id == job.id, Task.attempt == job.attempt, Task.dropped.is_(False))
            .order_by(Task.id)
        )
    )
