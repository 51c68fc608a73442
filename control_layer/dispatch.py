"""Messages for a node's stream, shaped like ``cpn.agent.v1.ServerMessage`` (proto field names)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from contracts.states import TaskState
from control_layer.task_states import move_task
from orchestration.bus.base import Bus
from orchestration.db.models import Task
from orchestration.events import node_channel, publish_after_commit


def assignment_message(task: Task) -> dict[str, Any]:
    return {
        "assignment": {
            "assignment_id": task.id,
            "job_id": task.job_id,
            "attempt": task.attempt,
            "device_indices": list(task.device_indices),
            "nproc": len(task.device_indices),
            "worker_config_json": json.dumps(task.worker_config, sort_keys=True),
        }
    }


def cancel_message(task: Task, reason: str) -> dict[str, Any]:
    return {"cancel": {"assignment_id": task.id, "reason": reason}}


def preempt_message(task: Task, reason: str, grace_s: float) -> dict[str, Any]:
    return {"preempt": {"assignment_id": task.id, "reason": reason, "grace_s": grace_s}}


def dispatch(session: Session, bus: Bus, task: Task) -> None:
    """Send the task to its node once the placing transaction commits."""
    move_task(task, TaskState.DISPATCHED)
    publish_after_commit(session, bus, node_channel(task.node_id), assignment_message(task))


def send_cancel(session: Session, bus: Bus, task: Task, reason: str) -> None:
    publish_after_commit(session, bus, node_channel(task.node_id), cancel_message(task, reason))


def send_preempt(session: Session, bus: Bus, task: Task, reason: str, grace_s: float) -> None:
    """Ask the task's workers to checkpoint and stop (``control_layer.preemption``), after the commit."""
    publish_after_commit(session, bus, node_channel(task.node_id), preempt_message(task, reason, grace_s))


def send_peer_lost(
    session: Session, bus: Bus, survivor: Task, lost: Task, participant: str, reason: str
) -> None:
    """Tell a surviving task's node that ``lost`` is gone, so its worker stops waiting for it now."""
    sync = (lost.worker_config or {}).get("sync") or {}
    message = {
        "peer_lost": {
            "assignment_id": survivor.id,
            "participant": participant,
            "address": str(sync.get("advertise") or sync.get("listen") or ""),
            "reason": reason,
        }
    }
    publish_after_commit(session, bus, node_channel(survivor.node_id), message)
