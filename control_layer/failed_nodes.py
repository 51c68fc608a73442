"""The nodes a job's re-placement stays off: those where its tasks failed, less the nodes of a
torchrun group spanning nodes whose failure was another node's loss.

When a node of a group dies, the group's other nodes lose their peer and their workers fail at
once (a collective's connection closes), before the dead node is even found lost. Their failure
says nothing about their own nodes: a group-mate's node lost in the same attempt clears them.
Until it is found lost, they are avoided like any other (the placement that follows may then
land on the dead node, which fails in turn and clears them).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.states import TaskState
from orchestration.db.models import Node, Task


def _group_key(task: Task) -> tuple[int, str] | None:
    """(attempt, participant) of a task that ran part of a group spanning nodes, else None."""
    if not (task.worker_config or {}).get("group"):
        return None
    return task.attempt, str(task.worker_config.get("region") or task.region)


def nodes_to_avoid(session: Session, job_id: str) -> frozenset[str]:
    tasks = list(session.scalars(select(Task).where(Task.job_id == job_id)))
    lost = set(session.scalars(select(Node.id).where(Node.status == "lost")))
    broken = {_group_key(t) for t in tasks if t.node_id in lost} - {None}  # groups that lost a node
    return frozenset(
        t.node_id
        for t in tasks
        if t.status == TaskState.FAILED and (t.node_id in lost or _group_key(t) not in broken)
    )
