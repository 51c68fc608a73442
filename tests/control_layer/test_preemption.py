"""The preemption mechanism on the control plane: the request, the orders to the nodes, the
requeue once the tasks have stopped (not a retry), the race with a task that finishes first, the
deadline for tasks that never report, and the refusals."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.states import JobState
from control_layer.jobs import job_tasks
from control_layer.placer import place_pending
from control_layer.preemption import (
    expire_preemptions,
    preempt_job,
    preemption_refusal,
    request_preemption,
)
from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Event, Job, LedgerTransaction, Task
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec

SPEC = tiny_spec(
    parallelism={"dp": 2}, sync={"mode": "sync", "every": 1}, qos={"max_hours": 1, "preemptible": True}
)


def _setup(ctx: ServerContext, spec: Any = SPEC) -> tuple[str, list[Task]]:
    """Four one-device nodes and a placed two-task job whose tasks both run (on two of them)."""
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        add_cluster(s, region="eu-west", name="c1", nodes=4, devices_per_node=1, price=2.0)
        tenant_id = tenant.id
    job = submit_and_place(ctx, tenant_id, spec=spec)
    assert job.status == "placed"
    tasks = _tasks(ctx, job.id)
    for t in tasks:
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    return job.id, tasks


def _job(ctx: ServerContext, job_id: str) -> Job:
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _tasks(ctx: ServerContext, job_id: str, attempt: int | None = None) -> list[Task]:
    with session_scope(ctx.session_factory) as s:
        return job_tasks(s, job_id, attempt=attempt)


def _events(ctx: ServerContext, job_id: str, kind: str) -> list[dict[str, Any]]:
    with session_scope(ctx.session_factory) as s:
        rows = s.scalars(select(Event).where(Event.job_id == job_id, Event.kind == kind).order_by(Event.id))
        return [dict(e.payload or {}) for e in rows]


def _allocated(ctx: ServerContext, job_id: str) -> set[str]:
    with session_scope(ctx.session_factory) as s:
        return set(
            s.scalars(
                select(Allocation.task_id).where(Allocation.job_id == job_id, Allocation.active.is_(True))
            )
        )


def _stop_preempted(ctx: ServerContext, task: Task, step: int) -> None:
    """What an agent reports for a worker that checkpointed ``step`` and stopped: the last step's
    metrics, then the task cancelled with the worker's result."""
    on_task_metrics(ctx, task.node_id, task.id, {"step": step, "loss": 3.0, "checkpoint_step": step})
    result = {"steps": step, "checkpoint_step": step, "preempted": True}
    on_task_status(ctx, task.node_id, task.id, "cancelled", "preempted", 0, result)


def test_refusals_are_pure() -> None:
    yes = {"qos": {"preemptible": True}}
    assert preemption_refusal("running", yes, False) is None
    assert preemption_refusal("placed", yes, False) is None
    assert "qos.preemptible" in (preemption_refusal("running", {"qos": {}}, False) or "")
    assert "queued" in (preemption_refusal("queued", yes, False) or "")
    assert "already" in (preemption_refusal("running", yes, True) or "")


def test_a_preempted_job_requeues_once_its_tasks_stopped_and_resumes_from_their_checkpoint(
    ctx: ServerContext,
) -> None:
    job_id, (t1, t2) = _setup(ctx)

    async def preempt_and_watch() -> list[tuple[str, dict]]:
        async with ctx.bus.subscribe("node.*") as sub:
            assert await asyncio.to_thread(preempt_job, ctx, job_id, reason="room for urgent", by_job_id="j9")
            return [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(2)]

    orders = asyncio.run(preempt_and_watch())
    assert sorted((c, m["preempt"]["assignment_id"]) for c, m in orders) == sorted(
        (f"node.{t.node_id}", t.id) for t in (t1, t2)
    )
    assert all(m["preempt"]["reason"] == "room for urgent" and m["preempt"]["grace_s"] > 0 for _, m in orders)
    job = _job(ctx, job_id)
    # The job keeps its devices until its workers have stopped.
    assert job.status == "running" and job.preemption and job.preemption["by_job_id"] == "j9"
    assert _allocated(ctx, job_id) == {t1.id, t2.id}
    assert not preempt_job(ctx, job_id, reason="again")  # already under way: nothing changes
    assert len(_events(ctx, job_id, "job.preempting")) == 1

    _stop_preempted(ctx, t1, 17)
    assert _job(ctx, job_id).status == "running"  # the other still stops
    _stop_preempted(ctx, t2, 17)
    job = _job(ctx, job_id)
    assert (job.status, job.preemption, job.preemptions) == (JobState.PENDING, None, 1)
    assert job.reason == "preempted by job j9: room for urgent"
    assert _allocated(ctx, job_id) == set()
    (event,) = _events(ctx, job_id, "job.preempted")
    assert (event["by_job_id"], event["reason"]) == ("j9", "room for urgent")
    assert {k: v["checkpoint_step"] for k, v in event["tasks"].items()} == {t1.id: 17, t2.id: 17}
    assert {v["step"] for v in event["resume_from"].values()} == {17}

    # Placed again, every task resumes at the checkpointed step.
    place_pending(ctx)
    job = _job(ctx, job_id)
    assert (job.status, job.attempt) == ("placed", 2)
    second = _tasks(ctx, job_id, attempt=2)
    assert len(second) == 2
    assert {t.worker_config["checkpoint"]["resume_at_most"] for t in second} == {17}
    # Not a retry: two failures in a row are still re-placed (max 2 retries), the third is final.
    for attempt in (2, 3):
        failing = _tasks(ctx, job_id, attempt=attempt)[0]
        on_task_status(ctx, failing.node_id, failing.id, "failed", "boom", 1, None)
        assert _job(ctx, job_id).status == "queued"
        place_pending(ctx)
    failing = _tasks(ctx, job_id, attempt=4)[0]
    on_task_status(ctx, failing.node_id, failing.id, "failed", "boom", 1, None)
    assert _job(ctx, job_id).status == "failed"

    # The ledger charges the device time of every attempt, the preempted one included.
    with session_scope(ctx.session_factory) as s:
        lines = s.scalars(select(LedgerTransaction).where(LedgerTransaction.job_id == job_id)).all()
    assert {t1.id, t2.id} <= {line.task_id for line in lines}


def test_a_task_that_finishes_while_being_preempted_ends_the_job_as_it_would_have(ctx: ServerContext) -> None:
    job_id, (t1, t2) = _setup(ctx)
    assert preempt_job(ctx, job_id, reason="room")
    on_task_status(ctx, t1.node_id, t1.id, "succeeded", "done", 0, {"steps": 4})
    on_task_status(ctx, t2.node_id, t2.id, "succeeded", "done", 0, {"steps": 4})
    job = _job(ctx, job_id)
    assert (job.status, job.preemption, job.preemptions) == ("succeeded", None, 0)
    assert _events(ctx, job_id, "job.preempted") == []


def test_one_finished_and_one_stopped_requeues_the_job(ctx: ServerContext) -> None:
    job_id, (t1, t2) = _setup(ctx)
    assert preempt_job(ctx, job_id, reason="room")
    on_task_status(ctx, t1.node_id, t1.id, "succeeded", "done", 0, {"steps": 4, "checkpoint_step": 4})
    assert _job(ctx, job_id).status == "running"
    _stop_preempted(ctx, t2, 3)
    job = _job(ctx, job_id)
    assert (job.status, job.preemptions) == ("queued", 1)


def test_tasks_that_never_report_are_cancelled_at_the_deadline(ctx: ServerContext) -> None:
    job_id, (t1, t2) = _setup(ctx)
    assert preempt_job(ctx, job_id, reason="room", grace_s=5)
    _stop_preempted(ctx, t1, 9)
    assert expire_preemptions(ctx) == []  # not yet due
    assert expire_preemptions(ctx, now=utcnow() + timedelta(seconds=60)) == [job_id]
    job = _job(ctx, job_id)
    assert (job.status, job.preemptions) == ("queued", 1)
    statuses = {t.id: t.status for t in _tasks(ctx, job_id, attempt=1)}
    assert statuses == {t1.id: "cancelled", t2.id: "cancelled"}
    (event,) = _events(ctx, job_id, "job.preempted")
    assert "did not stop within 5s" in event["late"]
    assert event["tasks"][t2.id]["status"] == "cancelled (late)"
    # Its late report changes nothing.
    _stop_preempted(ctx, t2, 9)
    assert _job(ctx, job_id).status == "queued"


def test_a_job_that_does_not_allow_preemption_is_refused_and_left_alone(ctx: ServerContext) -> None:
    spec = tiny_spec(parallelism={"dp": 2}, sync={"mode": "sync", "every": 1})
    job_id, _ = _setup(ctx, spec)
    assert not preempt_job(ctx, job_id, reason="room")
    with pytest.raises(FailedPrecondition, match="qos.preemptible"):
        request_preemption(ctx, job_id, reason="room")
    job = _job(ctx, job_id)
    assert (job.status, job.preemption) == ("running", None)
    assert _events(ctx, job_id, "job.preempting") == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"reason": " "}, "reason"), ({"grace_s": float("nan")}, "grace_s"), ({"grace_s": 0.0}, "grace_s")],
)
def test_bad_requests_are_refused(ctx: ServerContext, kwargs: dict[str, Any], field: str) -> None:
    job_id, _ = _setup(ctx)
    with pytest.raises(InvalidArgument) as err:
        request_preemption(ctx, job_id, **({"reason": "room"} | kwargs))
    assert err.value.details.get("field") == field
    assert _job(ctx, job_id).preemption is None
