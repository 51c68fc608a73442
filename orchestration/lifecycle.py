"""Job and task state machines. Every job transition is persisted and emitted as an Event.

    pending ──► placed ──► running ──► succeeded
       │          │           │
       │          ├───────────┴──► pending   (a task failed; re-placed as attempt + 1)
       └──────────┴───────────┴──► failed | cancelled

``attempt`` counts placements: the move pending → placed increments it, and the tasks created by
that placement carry the new number, so reports from an older attempt are recognisably stale.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, InvalidArgument
from orchestration.bus.base import Bus
from orchestration.db.base import utcnow
from orchestration.db.models import Job
from orchestration.events import record_event

JOB_STATES = ("pending", "placed", "running", "succeeded", "failed", "cancelled")
JOB_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"placed", "failed", "cancelled"}),
    "placed": frozenset({"running", "pending", "failed", "cancelled"}),
    "running": frozenset({"succeeded", "pending", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

TASK_STATES = ("pending", "dispatched", "starting", "running", "succeeded", "failed", "cancelled")
TASK_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
TASK_ACTIVE = frozenset({"pending", "dispatched", "starting", "running"})
_TASK_RANK = {s: i for i, s in enumerate(TASK_STATES[:4])}


def can_transition(current: str, to: str) -> bool:
    return to in JOB_TRANSITIONS.get(current, frozenset())


def transition(
    session: Session,
    bus: Bus,
    job: Job,
    to: str,
    *,
    reason: str | None = None,
    payload: dict[str, Any] | None = None,
) -> Job:
    """Move ``job`` to ``to`` in the caller's transaction; refuse illegal moves with FailedPrecondition."""
    if to not in JOB_TRANSITIONS:
        raise InvalidArgument(f"unknown job state {to!r}", field="status", allowed=list(JOB_STATES))
    current = job.status
    if not can_transition(current, to):
        raise FailedPrecondition(
            f"job {job.id} cannot go from {current} to {to}", job_id=job.id, current=current, requested=to
        )
    now = utcnow()
    job.status = to
    if reason is not None:
        job.reason = reason[:2000]
    if to == "placed":
        job.attempt += 1
    elif to == "running" and job.started_at is None:
        job.started_at = now
    elif to in JOB_TERMINAL:
        job.finished_at = now
    job.updated_at = now
    record_event(
        session,
        bus,
        f"job.{to}",
        job.id,
        {"from": current, "to": to, "attempt": job.attempt, "reason": job.reason, **(payload or {})},
    )
    return job


def normalize_task_state(state: str) -> str:
    """Accept 'running', 'RUNNING' or the proto enum name 'TASK_STATE_RUNNING'."""
    s = state.strip().lower().removeprefix("task_state_")
    if s not in TASK_STATES or s in ("pending", "dispatched"):
        raise InvalidArgument(
            f"task state {state!r} is not one an agent can report",
            field="state",
            allowed=["starting", "running", "succeeded", "failed", "cancelled"],
        )
    return s


def task_move_applies(current: str, to: str) -> bool:
    """Whether a reported task state moves the task forward (late or repeated reports are ignored)."""
    if current in TASK_TERMINAL:
        return False
    if to in TASK_TERMINAL:
        return True
    return _TASK_RANK[to] > _TASK_RANK[current]
