"""Task state changes: the one function that sets a task's state, and the shared message clipping."""

from __future__ import annotations

from typing import Any

from contracts.errors import InvalidArgument
from contracts.states import TASK_REPORTABLE, TASK_TERMINAL, TaskState
from orchestration.db.base import utcnow
from orchestration.db.models import Task

MESSAGE_LIMIT = 2000  # the width of jobs.reason, jobs.deferred and tasks.message


def clip_message(text: str) -> str:
    """A stored message (job reason, deferral, task message) cut to the column's width."""
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def move_task(
    task: Task,
    to: TaskState | str,
    *,
    message: str = "",
    exit_code: int | None = None,
    result: dict[str, Any] | None = None,
) -> None:
    """Set a task's state and what goes with it (message, exit code, result, timestamps)."""
    to = TaskState(to)
    now = utcnow()
    task.status = to
    if message:
        task.message = clip_message(message)
    if exit_code is not None and to in TASK_TERMINAL:
        task.exit_code = exit_code
    if result is not None:
        task.result = result
    if to is TaskState.RUNNING and task.started_at is None:
        task.started_at = now
    if to in TASK_TERMINAL:
        task.finished_at = now
        if task.started_at is None and to is TaskState.SUCCEEDED:
            task.started_at = now  # it ran, though its running report never came


def normalize_task_state(state: str) -> TaskState:
    """Accept 'running', 'RUNNING' or the proto enum name 'TASK_STATE_RUNNING'."""
    s = state.strip().lower().removeprefix("task_state_")
    if s not in {t.value for t in TASK_REPORTABLE}:
        raise InvalidArgument(
            f"task state {state!r} is not one an agent can report",
            field="state",
            allowed=sorted(t.value for t in TASK_REPORTABLE),
        )
    return TaskState(s)
