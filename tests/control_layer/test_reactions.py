"""Reactions to node reports: running, success with a ledger entry, failure with re-placement on
what remains, failure for good when nothing remains, lost nodes, metrics, reconnects."""

from __future__ import annotations

import asyncio
import math

import pytest
from sqlalchemy import select

from contracts.errors import InvalidArgument, NotFound, PermissionDenied
from contracts.states import JobState
from control_layer.jobs import job_tasks
from control_layer.placer import place_pending
from control_layer.reactions import (
    aggregate_results,
    on_node_lost,
    on_task_metrics,
    on_task_status,
    pending_assignments,
)
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Event, Job, LedgerTransaction, Node, Task, TaskMetric
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec

# Two replicas: one device each on two of the three nodes. Sync mode: a lost task stops the attempt
# (elastic modes go on without it: tests/control_layer/test_elastic.py).
SPEC = tiny_spec(parallelism={"dp": 2}, sync={"mode": "sync", "every": 1})


def _setup(ctx: ServerContext) -> tuple[str, list[str]]:
    """Three one-device nodes in one cluster and a submitted two-task job on two of them."""
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        _, nodes = add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1, price=2.0)
        tenant_id, node_ids = tenant.id, [n.id for n in nodes]
    job = submit_and_place(ctx, tenant_id, spec=SPEC)
    assert job.status == "placed"
    return job.id, node_ids


def _job(ctx: ServerContext, job_id: str) -> Job:
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _tasks(ctx: ServerContext, job_id: str, attempt: int | None = None) -> list[Task]:
    with session_scope(ctx.session_factory) as s:
        return job_tasks(s, job_id, attempt=attempt)


def _active(ctx: ServerContext, job_id: str) -> set[str]:
    with session_scope(ctx.session_factory) as s:
        return set(
            s.scalars(
                select(Allocation.task_id).where(Allocation.job_id == job_id, Allocation.active.is_(True))
            )
        )


def test_byte_counts_sum_over_tasks_only_where_every_task_has_them() -> None:
    def task(i: int, result: dict) -> Task:
        return Task(id=f"t{i}", region=f"r{i}", worker_config={"sync": {"replica_offset": i}}, result=result)

    merged = aggregate_results(
        [
            task(0, {"wan_bytes_sent": 10, "wan_wire_bytes_sent": 11, "steps": 4}),
            task(1, {"wan_bytes_sent": 20, "steps": 4}),  # its kernel counters were unavailable
        ]
    )
    assert merged["wan_bytes_sent"] == 30 and merged["steps"] == 4
    assert "wan_wire_bytes_sent" not in merged  # unavailable for the job, not the first task's
    assert merged["per_task"]["t0"]["wan_wire_bytes_sent"] == 11


def test_running_then_succeeded_aggregates_results_and_charges_the_ledger(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    t1, t2 = _tasks(ctx, job_id)
    on_task_status(ctx, t1.node_id, t1.id, "starting", "", None, None)
    on_task_status(ctx, t1.node_id, t1.id, "running", "", None, None)
    assert _job(ctx, job_id).status == "placed"  # not every task runs yet
    on_task_status(ctx, t2.node_id, t2.id, "TASK_STATE_RUNNING", "", None, None)
    assert _job(ctx, job_id).status == "running"
    on_task_status(ctx, t1.node_id, t1.id, "starting", "", None, None)  # late: ignored
    on_task_status(
        ctx, t1.node_id, t1.id, "succeeded", "done", 0, {"loss_end": 2.0, "steps": 4, "floor": 1.5}
    )
    assert _job(ctx, job_id).status == "running"
    on_task_status(
        ctx, t2.node_id, t2.id, "succeeded", "done", 0, {"loss_end": 3.0, "steps": 4, "floor": 1.5}
    )
    job = _job(ctx, job_id)
    assert job.status == "succeeded" and job.finished_at is not None
    assert job.result is not None
    assert (job.result["loss_end"], job.result["steps"], job.result["floor"]) == (2.5, 4, 1.5)
    assert set(job.result["per_task"]) == {t1.id, t2.id}
    assert _active(ctx, job_id) == set()
    with session_scope(ctx.session_factory) as s:
        lines = s.scalars(select(LedgerTransaction).where(LedgerTransaction.job_id == job_id)).all()
        kinds = s.scalars(select(Event.kind).where(Event.job_id == job_id).order_by(Event.id)).all()
    assert {line.task_id for line in lines} == {t1.id, t2.id}
    assert all(line.kind == "gpu" and line.unit_price == 2.0 and line.quantity > 0 for line in lines)
    assert job.actual_cost == sum(line.amount_micros for line in lines) / 1_000_000
    assert kinds[:2] == ["job.submitted", "job.placed"] and kinds[-1] == "job.succeeded"
    assert kinds.count("job.running") == 1


def test_failed_task_is_replaced_on_remaining_capacity_then_fails_when_none_remains(
    ctx: ServerContext,
) -> None:
    job_id, node_ids = _setup(ctx)
    first = _tasks(ctx, job_id, attempt=1)
    bad, sibling = first
    for t in first:
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)

    async def fail_and_watch() -> list[tuple[str, dict]]:
        async with ctx.bus.subscribe("node.*") as sub:
            await asyncio.to_thread(on_task_status, ctx, bad.node_id, bad.id, "failed", "CUDA error", 1, None)
            # the reaction only moves the job back to pending (and frees its devices): the placer re-places
            assert (_job(ctx, job_id).status, _active(ctx, job_id)) == (JobState.PENDING, set())
            await asyncio.to_thread(place_pending, ctx)
            return [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(3)]

    messages = asyncio.run(fail_and_watch())
    # the sibling is told to stop; the new attempt's two assignments go out
    cancels = [(c, m["cancel"]) for c, m in messages if "cancel" in m]
    assignments = [(c, m["assignment"]) for c, m in messages if "assignment" in m]
    assert [(c, m["assignment_id"]) for c, m in cancels] == [(f"node.{sibling.node_id}", sibling.id)]
    assert len(assignments) == 2 and {m["attempt"] for _, m in assignments} == {2}

    job = _job(ctx, job_id)
    assert (job.status, job.attempt) == ("placed", 2)
    assert "CUDA error" in job.reason and "attempt 2" in job.reason
    second = _tasks(ctx, job_id, attempt=2)
    assert bad.node_id not in {t.node_id for t in second}  # stays off the node that failed
    assert {t.node_id for t in second} == set(node_ids) - {bad.node_id}
    assert {t.status for t in _tasks(ctx, job_id, attempt=1)} == {"failed", "cancelled"}
    assert _active(ctx, job_id) == {t.id for t in second}

    # a late report from the first attempt changes nothing (and the node is told to stop it)
    on_task_status(ctx, sibling.node_id, sibling.id, "failed", "killed", -15, None)
    assert _job(ctx, job_id).status == "placed"

    # the second attempt fails too: only one healthy node is left, the job needs two
    failing = second[0]
    on_task_status(ctx, failing.node_id, failing.id, "failed", "segfault", 139, None)
    assert _job(ctx, job_id).status == JobState.PENDING
    assert place_pending(ctx) == [job_id]
    job = _job(ctx, job_id)
    assert (job.status, job.attempt) == ("failed", 2)
    assert "segfault" in job.reason and "no feasible placement" in job.reason
    assert _active(ctx, job_id) == set()
    assert {t.status for t in _tasks(ctx, job_id, attempt=2)} == {"failed", "cancelled"}


def test_retry_budget_is_respected(ctx: ServerContext) -> None:
    ctx.settings.max_job_retries = 0
    job_id, _ = _setup(ctx)
    t = _tasks(ctx, job_id)[0]
    on_task_status(ctx, t.node_id, t.id, "failed", "oom", 137, None)
    job = _job(ctx, job_id)
    assert job.status == "failed" and "gave up after 1 attempt" in job.reason and "oom" in job.reason


def test_a_task_its_scheduler_took_away_after_a_checkpoint_is_replaced_without_a_retry(
    ctx: ServerContext,
) -> None:
    """Lost (Slurm preempted it) with a checkpoint past its start: re-placed, no retry spent, the
    job's preemptions counting it; lost again without progress, it spends one like any failure."""
    ctx.settings.max_job_retries = 0
    job_id, _ = _setup(ctx)
    t = _tasks(ctx, job_id)[0]
    on_task_status(ctx, t.node_id, t.id, "running")
    why = "Slurm ended job 7 as PREEMPTED"
    on_task_status(ctx, t.node_id, t.id, "failed", why, 143, {"checkpoint_step": 3}, lost=True)
    job = _job(ctx, job_id)
    assert (job.status, job.preemptions) == (JobState.PENDING, 1)
    assert f"{t.id} on node {t.node_id} (eu-west) lost: {why}" in job.reason
    assert "re-placing from its checkpoint of step 3 (no retry spent)" in job.reason
    with session_scope(ctx.session_factory) as s:
        payload = s.scalars(select(Event.payload).where(Event.kind == "task.failed")).one()
    assert payload["task_id"] == t.id and payload["lost"] is True

    assert place_pending(ctx) == [job_id]
    again = _tasks(ctx, job_id, attempt=2)[0]
    assert again.worker_config["checkpoint"]["start_step"] == 3  # resumes where it was taken away
    on_task_status(ctx, again.node_id, again.id, "failed", why, 143, {"checkpoint_step": 3}, lost=True)
    job = _job(ctx, job_id)
    assert (job.status, job.preemptions) == ("failed", 1) and "gave up after 2 attempt(s)" in job.reason


def test_lost_node_fails_its_tasks_and_the_job_moves_on(ctx: ServerContext) -> None:
    job_id, node_ids = _setup(ctx)
    lost = _tasks(ctx, job_id)[0]
    affected = on_node_lost(ctx, lost.node_id, "missed 2 heartbeats")
    assert affected == [lost.id]
    with session_scope(ctx.session_factory) as s:
        node = s.get(Node, lost.node_id)
        assert node is not None and node.status == "lost"
        task = s.get(Task, lost.id)
        assert task is not None and task.status == "failed" and "node lost" in task.message
    assert (_job(ctx, job_id).status, _job(ctx, job_id).attempt) == (JobState.PENDING, 1)
    assert place_pending(ctx) == [job_id]
    assert (_job(ctx, job_id).status, _job(ctx, job_id).attempt) == (JobState.PLACED, 2)
    assert lost.node_id not in {t.node_id for t in _tasks(ctx, job_id, attempt=2)}


def test_metrics_are_stored_published_and_sanitised(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    t = _tasks(ctx, job_id)[0]

    async def main() -> dict:
        async with ctx.bus.subscribe(f"job.{job_id}") as sub:
            await asyncio.to_thread(
                on_task_metrics,
                ctx,
                t.node_id,
                t.id,
                {
                    "step": 3,
                    "total_steps": 4,
                    "loss": 2.5,
                    "tokens_per_s": 100.0,
                    "wan_bytes_sent": 3_000_000_000,
                },
            )
            await asyncio.to_thread(on_task_metrics, ctx, t.node_id, t.id, {"step": 4, "loss": math.nan})
            first = (await asyncio.wait_for(sub.__anext__(), 5))[1]
            second = (await asyncio.wait_for(sub.__anext__(), 5))[1]
            assert second["metrics"]["loss"] is None
            return first

    published = asyncio.run(main())
    assert published["kind"] == "task.metrics" and published["metrics"]["loss"] == 2.5
    with session_scope(ctx.session_factory) as s:
        rows = s.scalars(select(TaskMetric).where(TaskMetric.task_id == t.id).order_by(TaskMetric.step)).all()
        task = s.get(Task, t.id)
    assert [(r.step, r.loss) for r in rows] == [(3, 2.5), (4, None)]
    assert rows[0].wan_bytes_sent == 3_000_000_000  # beyond 32 bits
    assert task is not None and task.last_metrics == {"step": 4, "loss": None}
    # a replay after a reconnect (or a late copy) adds no row and does not move the latest back
    on_task_metrics(ctx, t.node_id, t.id, {"step": 4, "loss": 9.0})
    on_task_metrics(ctx, t.node_id, t.id, {"step": 3, "loss": 9.0})
    with session_scope(ctx.session_factory) as s:
        again = s.scalars(select(TaskMetric).where(TaskMetric.task_id == t.id)).all()
        task = s.get(Task, t.id)
    assert len(again) == 2 and task is not None and task.last_metrics == {"step": 4, "loss": None}
    with pytest.raises(InvalidArgument) as info:
        on_task_metrics(ctx, t.node_id, t.id, {"loss": 1.0})
    assert info.value.details["field"] == "metrics.step"


def test_reports_from_the_wrong_node_or_unknown_tasks_are_refused(ctx: ServerContext) -> None:
    job_id, node_ids = _setup(ctx)
    t = _tasks(ctx, job_id)[0]
    other = next(n for n in node_ids if n != t.node_id)
    with pytest.raises(PermissionDenied):
        on_task_status(ctx, other, t.id, "running", "", None, None)
    with pytest.raises(PermissionDenied):
        on_task_metrics(ctx, other, t.id, {"step": 1, "loss": 1.0})
    with pytest.raises(NotFound):
        on_task_status(ctx, t.node_id, "nope", "running", "", None, None)
    with pytest.raises(InvalidArgument):
        on_task_status(ctx, t.node_id, t.id, "dancing", "", None, None)


def test_pending_assignments_resend_unfinished_tasks_of_the_live_attempt(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    t1, t2 = _tasks(ctx, job_id)
    on_task_status(ctx, t1.node_id, t1.id, "running", "", None, None)
    (resent,) = pending_assignments(ctx, t1.node_id)
    assert resent["assignment"]["assignment_id"] == t1.id and resent["assignment"]["attempt"] == 1
    on_task_status(ctx, t1.node_id, t1.id, "succeeded", "", 0, {})
    assert pending_assignments(ctx, t1.node_id) == []
    assert [m["assignment"]["assignment_id"] for m in pending_assignments(ctx, t2.node_id)] == [t2.id]


def test_progress_while_starting_is_the_tasks_message_and_an_event_each_time_it_changes(
    ctx: ServerContext,
) -> None:
    job_id, _ = _setup(ctx)
    t1, _ = _tasks(ctx, job_id)
    on_task_status(ctx, t1.node_id, t1.id, "starting", "launching", None, None)
    for message in (
        "staging data 45% (1.0 of 2.2 MB)",
        "staging data 45% (1.0 of 2.2 MB)",
        "staging data 100%",
    ):
        on_task_status(ctx, t1.node_id, t1.id, "starting", message, None, None)
    with session_scope(ctx.session_factory) as s:
        events = s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)).all()
        progress = [e.payload["message"] for e in events if e.kind == "task.progress"]
        task = s.get(Task, t1.id)
        assert task is not None and (task.status, task.message) == ("starting", "staging data 100%")
    assert progress == ["staging data 45% (1.0 of 2.2 MB)", "staging data 100%"]
    on_task_status(ctx, t1.node_id, t1.id, "running", "pid 1", None, None)
    on_task_status(ctx, t1.node_id, t1.id, "starting", "late", None, None)  # after running: ignored
    assert _tasks(ctx, job_id)[0].message == "pid 1"
