"""The one place job and task states change, and where a job's end has its side effects.

    queued ──► placed ──► running ──► succeeded
       │          │           │
       │          ├───────────┴──► queued    (a task failed, or preempted; re-placed as attempt + 1)
       └──────────┴───────────┴──► failed | cancelled

``attempt`` counts placements: the move queued → placed increments it, and the tasks created by
that placement carry the new number, so reports from an older attempt are recognisably stale.
Leaving an attempt (back to queued, or to an end state) stops its still-active tasks, releases
the job's devices, closes its tasks' meters (``orchestration.ledger``) and wakes the placer; an end
state also sets the job's actual cost from the ledger, records the job's estimate next to its
actual, and (on success) calibrates the planner from the run. Callers never do any of that themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.states import JOB_TERMINAL, TASK_ACTIVE, JobState, TaskState, job_can_move
from control_layer.allocation import release
from control_layer.calibration_store import on_job_end
from control_layer.dispatch import send_cancel
from control_layer.task_states import clip_message, move_task
from orchestration.bus.base import Bus
from orchestration.db.base import utcnow
from orchestration.db.models import Job, Task
from orchestration.events import publish_after_commit, record_event
from orchestration.ledger import close_job, meter_job

log = logging.getLogger(__name__)

PLACER_CHANNEL = "placer"  # a message here wakes the placer: a job waits, or devices came free


def wake_placer(session: Session, bus: Bus, why: str, job_id: str | None = None) -> None:
    """Wake the placer once this transaction commits (it also polls, so a lost message only delays)."""
    publish_after_commit(session, bus, PLACER_CHANNEL, {"why": why, "job_id": job_id})


def transition(
    session: Session,
    bus: Bus,
    job: Job,
    to: JobState | str,
    *,
    reason: str | None = None,
    payload: dict[str, Any] | None = None,
    tasks_note: str | None = None,
) -> Job:
    """Move ``job`` to ``to`` in the caller's transaction; refuse illegal moves with FailedPrecondition.

    ``tasks_note`` is what the attempt's still-active tasks are told when the job leaves the attempt
    (default: ``reason``)."""
    try:
        to = JobState(to)
    except ValueError:
        raise InvalidArgument(
            f"unknown job state {to!r}", field="status", allowed=[s.value for s in JobState]
        ) from None
    current = JobState(job.status)
    if not job_can_move(current, to):
        raise FailedPrecondition(
            f"job {job.id} cannot go from {current} to {to}", job_id=job.id, current=current, requested=to
        )
    now = utcnow()
    job.status = to
    job.deferred = None  # any move settles a deferral
    job.queue_position = None  # the placer's next pass gives a requeued job its place
    if reason is not None:
        job.reason = clip_message(reason)
    if to is JobState.PLACED:
        job.attempt += 1
    elif to is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    elif to in JOB_TERMINAL:
        job.finished_at = now
    job.updated_at = now

    # A job never placed has no tasks, devices or charges: nothing to stop, release or bill (a job
    # the placer rejects at once is the common case; each of those is a query saved).
    never_placed = current is JobState.QUEUED and job.attempt == 0
    leaves_attempt = to in JOB_TERMINAL or (to is JobState.QUEUED and current is not JobState.QUEUED)
    if leaves_attempt:
        job.preemption = None  # a preemption under way is settled by leaving the attempt
    if leaves_attempt and not never_placed:
        _stop_active_tasks(session, bus, job, tasks_note or job.reason or f"job {job.id} is {to}")
        if to not in JOB_TERMINAL:
            meter_job(session, job)  # the attempt's tasks have ended: close their meters (a retry, a requeue)
        if release(session, job.id):
            wake_placer(session, bus, "devices released", job.id)
    if to is JobState.QUEUED:
        wake_placer(session, bus, "job is queued", job.id)
    record_event(
        session,
        bus,
        f"job.{to}",
        job.id,
        {
            "from": current.value,
            "to": to.value,
            "attempt": job.attempt,
            "reason": job.reason,
            **(payload or {}),
        },
    )
    if to in JOB_TERMINAL:
        if never_placed:
            job.actual_cost = 0.0
        else:
            close_job(session, job)  # the last meters; actual_cost is the sum of the job's charges
        # After the charge: the estimate-vs-actual record compares the quote with the ledger.
        session.flush()
        _learn(session, bus, job)
    return job


def _learn(session: Session, bus: Bus, job: Job) -> None:
    """The job's estimate-vs-actual record and what calibration learns from it, in a savepoint: a
    failure there (a bug, a value the database refuses) must not stop the job from ending, or its
    agent's report would be refused, and resent, forever. The end commits without the record, and
    the failure is logged and kept as an event on the job."""
    try:
        with session.begin_nested():
            on_job_end(session, job)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the job's end must still commit
        log.exception("job %s: calibration from its end failed", job.id)
        record_event(session, bus, "job.calibration_failed", job.id, {"error": clip_message(repr(exc))})


def _stop_active_tasks(session: Session, bus: Bus, job: Job, note: str) -> None:
    for task in session.scalars(select(Task).where(Task.job_id == job.id, Task.status.in_(TASK_ACTIVE))):
        move_task(task, TaskState.CANCELLED, message=note)
        send_cancel(session, bus, task, note)
