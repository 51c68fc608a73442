"""The job's latest complete checkpoints, one per sync participant, from what its tasks reported.

A task's agent reports the step of the newest checkpoint its workers completed (``checkpoint_step``
in the task's metrics, kept on the task row). A participant keeps its name (``worker_config.region``)
across attempts, so a re-placed task finds its predecessor's record under its own name. The nodes
of a torchrun group spanning nodes are one participant, each holding the whole checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.db.models import Task


@dataclass(frozen=True)
class CheckpointRecord:
    participant: str
    step: int
    node_id: str
    task_id: str
    attempt: int
    region: str


def latest_by_participant(records: Iterable[CheckpointRecord]) -> dict[str, CheckpointRecord]:
    """The newest record of each participant (a later attempt wins a tie: it is the one that ran)."""
    best: dict[str, CheckpointRecord] = {}
    for r in records:
        cur = best.get(r.participant)
        if cur is None or (r.step, r.attempt) > (cur.step, cur.attempt):
            best[r.participant] = r
    return best


def _participant(task: Task) -> str:
    return str((task.worker_config or {}).get("region") or task.region)


def checkpoint_records(session: Session, job_id: str) -> list[CheckpointRecord]:
    """Every task's newest complete checkpoint, over all of the job's attempts."""
    rows = session.scalars(select(Task).where(Task.job_id == job_id, Task.checkpoint_step.is_not(None)))
    return [
        CheckpointRecord(
            participant=_participant(t),
            step=int(t.checkpoint_step or 0),
            node_id=t.node_id,
            task_id=t.id,
            attempt=t.attempt,
            region=t.region,
        )
        for t in rows
        if t.checkpoint_step
    ]


def job_checkpoints(session: Session, job_id: str) -> dict[str, dict[str, Any]]:
    """participant -> its latest complete checkpoint as plain data, over all of the job's attempts."""
    records = checkpoint_records(session, job_id)
    return {k: asdict(v) for k, v in sorted(latest_by_participant(records).items())}


def share_with_group(session: Session, task: Task) -> list[Task]:
    """A torchrun group spanning nodes reports through its leader only (node rank 0), and its save
    completes only once every node holds the whole checkpoint (``training.checkpoint_mirror``): the
    group's other tasks hold the step its leader reported. Records it on them; returns those."""
    step = task.checkpoint_step
    if not step or not (task.worker_config or {}).get("group"):
        return []
    key = _participant(task)
    peers = session.scalars(
        select(Task).where(Task.job_id == task.job_id, Task.attempt == task.attempt, Task.id != task.id)
    )
    shared = []
    for t in peers:
        same_group = (t.worker_config or {}).get("group") and _participant(t) == key
        if same_group and (t.checkpoint_step or 0) < step:
            t.checkpoint_step = step
            shared.append(t)
    return shared
