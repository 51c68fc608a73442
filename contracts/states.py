"""Job and task states, and which moves between them are legal.

    queued ──► placed ──► running ──► succeeded
      │          │           │
      │          ├───────────┴──► queued    (a task failed, or preempted; re-placed as attempt + 1)
      └──────────┴───────────┴──► failed | cancelled

States are ``StrEnum`` members: they are stored and sent as their plain string values. A queued job
waits for the placer (``control_layer.admission`` orders the queue); ``JobState.PENDING`` is an
alias of ``QUEUED`` (one value, ``"queued"``), kept so older callers read the same state.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    PENDING = "queued"  # alias of QUEUED: the same member
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in JOB_TERMINAL


class TaskState(StrEnum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TASK_TERMINAL


JOB_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
JOB_ACTIVE = frozenset({JobState.PLACED, JobState.RUNNING})
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.PLACED, JobState.FAILED, JobState.CANCELLED}),
    JobState.PLACED: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

TASK_TERMINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})
TASK_ACTIVE = frozenset({TaskState.PENDING, TaskState.DISPATCHED, TaskState.STARTING, TaskState.RUNNING})
# What an agent may report; pending and dispatched are the control plane's own.
TASK_REPORTABLE = frozenset(
    {TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}
)
_TASK_RANK = {TaskState.PENDING: 0, TaskState.DISPATCHED: 1, TaskState.STARTING: 2, TaskState.RUNNING: 3}


def job_can_move(current: JobState | str, to: JobState | str) -> bool:
    return JobState(to) in JOB_TRANSITIONS.get(JobState(current), frozenset())


def task_move_applies(current: TaskState | str, to: TaskState | str) -> bool:
    """Whether a reported task state moves the task forward (late or repeated reports are ignored)."""
    current, to = TaskState(current), TaskState(to)
    if current in TASK_TERMINAL:
        return False
    if to in TASK_TERMINAL:
        return True
    return _TASK_RANK[to] > _TASK_RANK[current]
