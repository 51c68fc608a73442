"""transition() runs a job's end-of-attempt side effects itself, exactly once on each path:
active tasks told to stop, devices released, the tasks' meters closed, the placer woken."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from contracts.states import JobState, TaskState
from control_layer.jobs import cancel_job, job_tasks
from control_layer.lifecycle import PLACER_CHANNEL
from control_layer.reactions import on_task_status
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Event, Job, LedgerTransaction, Task
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec


def _placed_two_task_job(ctx: ServerContext) -> tuple[str, str, list[Task]]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s).id
        add_cluster(s, region="eu-west", name="c1", nodes=2, devices_per_node=1, price=2.0)
    # sync mode: a failed task ends the attempt (elastic modes go on without it: test_elastic.py)
    spec = tiny_spec(parallelism={"dp": 2}, sync={"mode": "sync", "every": 1})
    job = submit_and_place(ctx, tenant, spec=spec)
    with session_scope(ctx.session_factory) as s:
        tasks = job_tasks(s, job.id)
    for t in tasks:
        on_task_status(ctx, t.node_id, t.id, "running")
    return tenant, job.id, tasks


def _fail_first(ctx: ServerContext, tasks: list[Task]) -> None:
    on_task_status(ctx, tasks[0].node_id, tasks[0].id, "failed", "oom", 137, None)


def _succeed_all(ctx: ServerContext, tasks: list[Task]) -> None:
    for t in tasks:
        on_task_status(ctx, t.node_id, t.id, "succeeded", "", 0, {"loss": 1.0})


PATHS: dict[str, tuple[int, Callable[[ServerContext, str, str, list[Task]], None], JobState, int]] = {
    # name: (max_job_retries, action, end state, cancels expected)
    "cancelled": (
        1,
        lambda ctx, tenant, job_id, tasks: cancel_job(ctx, job_id, "stop"),
        JobState.CANCELLED,
        2,
    ),
    "failed": (0, lambda ctx, tenant, job_id, tasks: _fail_first(ctx, tasks), JobState.FAILED, 1),
    "retry": (1, lambda ctx, tenant, job_id, tasks: _fail_first(ctx, tasks), JobState.QUEUED, 1),
    "succeeded": (1, lambda ctx, tenant, job_id, tasks: _succeed_all(ctx, tasks), JobState.SUCCEEDED, 0),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_side_effects_happen_once_in_transition(ctx: ServerContext, path: str) -> None:
    retries, act, end, cancels = PATHS[path]
    ctx.settings.max_job_retries = retries
    tenant, job_id, tasks = _placed_two_task_job(ctx)

    async def main() -> list[tuple[str, dict]]:
        async with ctx.bus.subscribe("node.*", PLACER_CHANNEL) as sub:
            await asyncio.to_thread(act, ctx, tenant, job_id, tasks)
            got: list[tuple[str, dict]] = []
            while True:
                try:
                    got.append(await asyncio.wait_for(sub.__anext__(), 0.5))
                except TimeoutError:
                    return got

    messages = asyncio.run(main())
    cancel_ids = [
        m["cancel"]["assignment_id"] for c, m in messages if c.startswith("node.") and "cancel" in m
    ]
    wakes = [m for c, m in messages if c == PLACER_CHANNEL]
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == end
        active = s.scalar(
            select(func.count()).where(Allocation.job_id == job_id, Allocation.active.is_(True))
        )
        ledger = s.scalars(
            select(LedgerTransaction.task_id).where(
                LedgerTransaction.job_id == job_id, LedgerTransaction.kind == "gpu"
            )
        ).all()
        metered = {t.id: t.metered_until for t in job_tasks(s, job_id)}
        finished = {t.id: t.finished_at for t in job_tasks(s, job_id)}
        kinds = s.scalars(select(Event.kind).where(Event.job_id == job_id)).all()
        statuses = {t.status for t in job_tasks(s, job_id)}
    assert active == 0  # released
    assert len(cancel_ids) == len(set(cancel_ids)) == cancels  # each still-active task told once
    assert TaskState.RUNNING not in statuses and TaskState.DISPATCHED not in statuses
    assert kinds.count(f"job.{end}") == 1
    # released devices wake the placer; a retry also wakes it for the job itself
    assert [w["why"] for w in wakes] == (
        ["devices released", "job is queued"] if end is JobState.QUEUED else ["devices released"]
    )
    # every path ends the attempt's tasks, and each task's meter closes at its end, once (a retry too)
    assert sorted(ledger) == sorted(t.id for t in tasks)
    assert metered == finished
