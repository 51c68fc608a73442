"""Elastic regions in the control plane: a lost task of a diloco job is re-placed alone while its
sibling trains on, the replacement starts at the survivors' step, a task nobody can replace is
dropped and the job still succeeds; sync mode and async's parameter server stop the attempt."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from contracts.errors import InvalidArgument
from control_layer.elastic import elastic_refusal
from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Event, Job, Task
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec

SPEC = tiny_spec(parallelism={"dp": 2}, training={"steps": 40, "global_batch_tokens": 64})  # diloco


def _setup(ctx: ServerContext) -> tuple[str, list[str]]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        _, nodes = add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1, price=2.0)
        tenant_id, node_ids = tenant.id, [n.id for n in nodes]
    job = submit_and_place(ctx, tenant_id, spec=SPEC)
    assert job.status == "placed"
    return job.id, node_ids


def _read(ctx: ServerContext, job_id: str) -> tuple[Job, list[Task], list[Event], set[str]]:
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None
        tasks = list(s.scalars(select(Task).where(Task.job_id == job_id).order_by(Task.created_at, Task.id)))
        events = list(s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)))
        active = set(
            s.scalars(select(Allocation.task_id).where(Allocation.job_id == job_id, Allocation.active))
        )
        return job, tasks, events, active


def test_lost_task_is_replaced_alone_and_the_job_goes_on(ctx: ServerContext) -> None:
    job_id, node_ids = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 17, "loss": 3.0, "checkpoint_step": 10})

    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    job, tasks, events, active = _read(ctx, job_id)
    assert (job.status, job.attempt) == ("running", 1)  # not stopped, not re-placed as a whole
    by_id = {t.id: t for t in tasks}
    assert by_id[sibling.id].status == "running" and by_id[bad.id].dropped
    (new,) = [t for t in tasks if t.id not in (bad.id, sibling.id)]
    assert new.attempt == 1 and new.status == "dispatched"
    assert new.node_id == (set(node_ids) - {bad.node_id, sibling.node_id}).pop()
    assert active == {sibling.id, new.id}  # the lost task's device is released
    cfg, old = new.worker_config, bad.worker_config
    assert cfg["region"] == old["region"]  # the survivors know it by its name
    assert cfg["sync"]["peers"] == {sibling.worker_config["region"]: sibling.worker_config["sync"]["listen"]}
    assert cfg["sync"]["listen"] == cfg["sync"]["advertise"] == f"127.0.0.1:{new.sync_port}"
    assert cfg["checkpoint"]["start_step"] == 17  # the survivors' step: it takes their model at once
    kinds = [e.kind for e in events]
    assert "job.region_lost" in kinds and "job.region_replaced" in kinds and "job.queued" not in kinds
    replaced = next(e for e in events if e.kind == "job.region_replaced")
    assert replaced.payload["task_id"] == new.id and replaced.payload["lost_task_id"] == bad.id

    # the replacement fails too and no node is left: the region is dropped, the sibling goes on
    on_task_status(ctx, new.node_id, new.id, "failed", "segfault", 139, None)
    job, tasks, events, active = _read(ctx, job_id)
    assert job.status == "running" and len(tasks) == 3 and active == {sibling.id}
    assert events[-1].kind == "job.region_dropped"
    on_task_status(
        ctx, sibling.node_id, sibling.id, "succeeded", "done", 0, {"steps": 40, "checkpoint_step": 40}
    )
    job, tasks, _, _ = _read(ctx, job_id)
    assert job.status == "succeeded"
    assert set(job.result["per_task"]) == {sibling.id}
    assert {t.id: t.checkpoint_step for t in tasks}[sibling.id] == 40


def test_sync_mode_pauses_the_whole_attempt(ctx: ServerContext) -> None:
    with session_scope(ctx.session_factory) as s:
        tenant_id = add_tenant(s).id
        add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1)
    spec = tiny_spec(parallelism={"dp": 2}, sync={"mode": "sync", "every": 1})
    job_id = submit_and_place(ctx, tenant_id, spec=spec).id
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    on_task_status(ctx, bad.node_id, bad.id, "failed", "boom", 1, None)
    job, tasks, events, _ = _read(ctx, job_id)
    assert job.status == "queued"
    kinds = [e.kind for e in events]
    assert kinds.index("job.paused") < kinds.index("job.queued")
    assert {t.id: t.status for t in tasks}[sibling.id] == "cancelled"


def _task(key: str, status: str = "running", **sync: object) -> Task:
    return Task(id=key, status=status, region=key, worker_config={"region": key, "sync": dict(sync)})


def test_which_losses_stop_the_attempt() -> None:
    a, b, c = _task("a"), _task("b"), _task("c")
    assert elastic_refusal("diloco", [a, b, c], b, 2) is None
    assert "lockstep" in (elastic_refusal("sync", [a, b], b, 2) or "")
    assert "still training" in (elastic_refusal("gossip", [a, _task("b", "cancelled")], a, 2) or "")
    assert elastic_refusal("gossip", [a, _task("b", "succeeded")], a, 2) is None  # b holds the model
    assert "parameter server" in (elastic_refusal("async", [a, b, c], a, 2) or "")  # first name serves
    assert elastic_refusal("async", [a, b, c], b, 2) is None
    named = [_task(k, ps_region="c") for k in "abc"]
    assert "parameter server" in (elastic_refusal("async", named, named[2], 2) or "")
    assert elastic_refusal("async", named, named[0], 2) is None
    assert "retries" in (elastic_refusal("local_sgd", [a, b], b, 0) or "")
    part = Task(
        id="g", status="running", region="g", worker_config={"region": "g", "group": {"node_rank": 1}}
    )
    assert "spanning nodes" in (elastic_refusal("diloco", [a, b, part], part, 2) or "")


def test_no_replacement_once_the_others_are_at_their_last_step(ctx: ServerContext) -> None:
    """A replacement then could only start from step 0 and train the whole run alone."""
    job_id, _ = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 40, "loss": 3.0, "checkpoint_step": 40})

    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    job, tasks, events, active = _read(ctx, job_id)
    assert job.status == "running" and len(tasks) == 2 and active == {sibling.id}
    assert events[-1].kind == "job.region_dropped" and "last step" in events[-1].payload["why"]


def test_a_balanced_region_past_the_jobs_steps_is_not_at_the_jobs_end(ctx: ServerContext) -> None:
    """Balanced rounds give a fast region more steps than training.steps: its job step says
    where the job is, so the lost region is still replaced."""
    job_id, _ = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    with pytest.raises(InvalidArgument, match="metrics.job_step"):
        on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 44, "job_step": -1.0})
    on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 44, "job_step": 30.0, "checkpoint_step": 40})

    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    job, tasks, events, _ = _read(ctx, job_id)
    assert job.status == "running" and len(tasks) == 3
    assert events[-1].kind == "job.region_replaced", [e.kind for e in events]


def test_a_replacement_the_others_finished_without_is_dropped(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 17, "loss": 3.0})
    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    _, tasks, _, _ = _read(ctx, job_id)
    (new,) = [t for t in tasks if t.id not in (bad.id, sibling.id)]
    on_task_status(ctx, new.node_id, new.id, "running", "", None, None)

    # The sibling finishes before its replacement has trained a step past its start: the
    # replacement could only wait for peers that are gone, so it is cancelled and dropped.
    on_task_status(ctx, sibling.node_id, sibling.id, "succeeded", "done", 0, {"steps": 40})
    job, tasks, events, active = _read(ctx, job_id)
    assert job.status == "succeeded" and set(job.result["per_task"]) == {sibling.id}
    replacement = {t.id: t for t in tasks}[new.id]
    assert replacement.status == "cancelled" and replacement.dropped and active == set()
    dropped = [e for e in events if e.kind == "job.region_dropped"]
    assert dropped and dropped[-1].payload["task_id"] == new.id


def test_a_replacement_that_trains_with_the_others_is_waited_for(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_metrics(ctx, sibling.node_id, sibling.id, {"step": 17, "loss": 3.0})
    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    _, tasks, _, _ = _read(ctx, job_id)
    (new,) = [t for t in tasks if t.id not in (bad.id, sibling.id)]
    on_task_status(ctx, new.node_id, new.id, "running", "", None, None)
    on_task_metrics(ctx, new.node_id, new.id, {"step": 39, "loss": 3.0})  # it met the others

    on_task_status(ctx, sibling.node_id, sibling.id, "succeeded", "done", 0, {"steps": 40})
    job, tasks, _, _ = _read(ctx, job_id)
    assert job.status == "running" and {t.id: t for t in tasks}[new.id].status == "running"
    on_task_status(ctx, new.node_id, new.id, "succeeded", "done", 0, {"steps": 40})
    job, _, _, _ = _read(ctx, job_id)
    assert job.status == "succeeded" and set(job.result["per_task"]) == {sibling.id, new.id}


def test_a_task_lost_after_the_others_finished_is_dropped_and_the_job_succeeds(ctx: ServerContext) -> None:
    job_id, _ = _setup(ctx)
    _, (bad, sibling), _, _ = _read(ctx, job_id)
    for t in (bad, sibling):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_status(ctx, sibling.node_id, sibling.id, "succeeded", "done", 0, {"steps": 40})
    on_task_status(ctx, bad.node_id, bad.id, "failed", "node lost: no heartbeat", None, None)
    job, tasks, events, active = _read(ctx, job_id)
    assert (job.status, job.attempt) == ("succeeded", 1)  # not paused and run again
    assert len(tasks) == 2 and {t.id: t for t in tasks}[bad.id].dropped and active == set()
    assert set(job.result["per_task"]) == {sibling.id}
    kinds = [e.kind for e in events]
    assert "job.region_dropped" in kinds and "job.paused" not in kinds and "job.queued" not in kinds
