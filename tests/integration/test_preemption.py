"""Preemption on the real job path (REST, PostgreSQL + Redis, a `cpn agent` process, torchrun
workers): a running preemptible job is preempted through the admin route, its workers checkpoint
the step they are at and stop, the job goes back to the queue, is placed again, resumes from that
checkpoint and succeeds; the ledger charges the device time of both runs. A job whose spec does
not allow preemption is refused with 409."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.db.engine import as_utc
from orchestration.db.models import Event, LedgerTransaction, Task, TaskMetric
from service_layer.cli.local_fleet import LocalAgent, stop_agents
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    job_event_kinds,
    job_spec,
    launch,
    wait_job,
    wait_training,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

STEPS = 600  # long enough that the job is still training when the preemption arrives (tens of seconds)
# Lockstep across two regions: asked at step ~50 on a quiet host, both had stopped by step 58; the
# resumed attempt only has to finish.
SYNC_STEPS = 160


def device_hours(task: Task) -> float:
    """Devices x hours the task ran, from its own start and finish times."""
    if task.started_at is None or task.finished_at is None:
        return 0.0
    return (
        len(task.device_indices) * (as_utc(task.finished_at) - as_utc(task.started_at)).total_seconds() / 3600
    )


def one_cluster_spec(*, preemptible: bool) -> dict[str, Any]:
    spec = job_spec(STEPS) | {"parallelism": {"dp": 2, "tp": 1, "pp": 1, "zero": 0}}
    spec["training"] = spec["training"] | {"global_batch_tokens": 2 * 4 * 32, "checkpoint_every": 10_000}
    spec["qos"] = spec["qos"] | {"preemptible": preemptible}
    return spec


def wait_event(handle: Any, job_id: str, kind: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with handle.ctx.session_factory() as session:
            event = session.scalars(
                select(Event).where(Event.job_id == job_id, Event.kind == kind).order_by(Event.id)
            ).first()
            if event is not None:
                return dict(event.payload or {})
        time.sleep(0.2)
    raise AssertionError(f"no {kind} event for job {job_id} within {timeout_s}s")


def test_a_preempted_job_checkpoints_requeues_and_resumes_where_it_stopped(
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    handle, client = control_plane
    procs = launch(
        handle,
        client,
        [LocalAgent("eu-west", "paris-1", "lumen", 2.0, "EU", measure_profile=False)],
        tmp_path,
    )
    try:
        # A job that does not allow preemption is refused, whatever it is doing, and left alone.
        fixed = client.post("/v1/jobs", json={"spec": one_cluster_spec(preemptible=False)}).raise_for_status()
        refused = client.post(f"/v1/jobs/{fixed.json()['id']}/preempt", json={"reason": "room"})
        assert refused.status_code == 409, refused.text
        assert "qos.preemptible" in refused.json()["message"]
        assert client.get(f"/v1/jobs/{fixed.json()['id']}").json()["preemption"] is None
        client.post(f"/v1/jobs/{fixed.json()['id']}/cancel", json={"reason": "make room"}).raise_for_status()
        # Bad input is a 422 naming the field.
        bad = client.post(f"/v1/jobs/{fixed.json()['id']}/preempt", json={"reason": "x", "grace_s": -1})
        assert bad.status_code == 422 and "grace_s" in bad.text

        job = (
            client.post("/v1/jobs", json={"spec": one_cluster_spec(preemptible=True)})
            .raise_for_status()
            .json()
        )
        running = wait_training(client, job["id"], min_step=30, timeout_s=200)
        (first,) = running["tasks"]
        at_request = first["last_metrics"]["step"]
        answer = client.post(
            f"/v1/jobs/{job['id']}/preempt", json={"reason": "room for an urgent job", "grace_s": 60}
        )
        assert answer.status_code == 202, answer.text
        assert answer.json()["preemption"]["reason"] == "room for an urgent job"
        again = client.post(f"/v1/jobs/{job['id']}/preempt", json={"reason": "again"})
        assert again.status_code == 409 and "already being preempted" in again.json()["message"]

        preempted = wait_event(handle, job["id"], "job.preempted", timeout_s=60)
        stopped = preempted["tasks"][first["id"]]
        assert stopped["status"] == "cancelled" and preempted["reason"] == "room for an urgent job"
        checkpoint = stopped["checkpoint_step"]
        # The checkpoint is of the step the workers were at when they stopped: nothing lost.
        assert checkpoint == stopped["step"] and checkpoint >= at_request, (stopped, at_request)
        assert checkpoint < STEPS
        (ckpt_dir,) = tmp_path.glob(f"agent-eu-west-paris-1/checkpoints/{job['id']}/*")
        assert (ckpt_dir / f"step_{checkpoint:08d}" / "COMPLETE").is_file()

        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert (done["attempt"], done["preemptions"], done["preemption"]) == (2, 1, None)
        (second,) = done["tasks"]
        assert second["id"] != first["id"] and second["attempt"] == 2
        assert done["result"]["per_task"][second["id"]]["resumed_from"] == checkpoint
        log = (tmp_path / "agent-eu-west-paris-1" / "assignments" / second["id"] / "worker.log").read_text()
        assert f"resumed from step {checkpoint} (checkpoint)" in log, log[-2000:]
        kinds = job_event_kinds(handle, job["id"])
        assert kinds.index("job.preempting") < kinds.index("job.preempted") < kinds.index("job.queued")
        assert kinds.count("job.placed") == 2

        with handle.ctx.session_factory() as session:
            resumed_at = session.scalar(
                select(TaskMetric.step).where(TaskMetric.task_id == second["id"]).order_by(TaskMetric.step)
            )
            tasks = session.scalars(select(Task).where(Task.job_id == job["id"])).all()
            lines = session.scalars(
                select(LedgerTransaction).where(LedgerTransaction.job_id == job["id"])
            ).all()
        assert resumed_at is not None and resumed_at > checkpoint
        # The charges cover the device time of both runs, the preempted one included.
        gpu = [line for line in lines if line.kind == "gpu"]
        assert {line.task_id for line in gpu} == {first["id"], second["id"]}
        assert sum(line.quantity for line in gpu) == pytest.approx(sum(device_hours(t) for t in tasks))
        assert all(line.quantity > 0 for line in gpu)
        assert done["actual_cost"] == pytest.approx(sum(line.amount_micros for line in lines) / 1e6)
    finally:
        stop_agents(procs)


def test_a_job_across_two_regions_stops_in_both_and_resumes_where_they_stopped(
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Lockstep sync across two regions: each region stops at its own next step boundary (one may
    be a step behind the other), and the job resumes at the step they have in common, not at an
    older checkpoint or step 0."""
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
        LocalAgent("eu-north", "stockholm-1", "fjord", 1.5, "EU", measure_profile=False),
    ]
    procs = launch(handle, client, specs, tmp_path)
    spec = job_spec(SYNC_STEPS) | {"sync": {"mode": "sync", "every": 1}}
    spec["training"] = spec["training"] | {"checkpoint_every": 10_000}
    spec["qos"] = spec["qos"] | {"preemptible": True}
    try:
        job = client.post("/v1/jobs", json={"spec": spec}).raise_for_status().json()
        running = wait_training(client, job["id"], min_step=30, timeout_s=200)
        assert {t["region"] for t in running["tasks"]} == {"eu-west", "eu-north"}
        at_request = min(t["last_metrics"]["step"] for t in running["tasks"])
        client.post(f"/v1/jobs/{job['id']}/preempt", json={"reason": "room"}).raise_for_status()

        preempted = wait_event(handle, job["id"], "job.preempted", timeout_s=90)
        stopped = {v["region"]: v for v in preempted["tasks"].values()}
        assert all(v["checkpoint_step"] and v["checkpoint_step"] >= at_request for v in stopped.values()), (
            stopped,
            at_request,
        )
        common = min(v["checkpoint_step"] for v in stopped.values())
        assert max(v["checkpoint_step"] for v in stopped.values()) - common <= 1, stopped

        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert (done["attempt"], done["preemptions"]) == (2, 1)
        per_task = done["result"]["per_task"]
        resumed = {per_task[t["id"]]["region"]: per_task[t["id"]]["resumed_from"] for t in done["tasks"]}
        assert set(resumed.values()) == {common}, (resumed, stopped)
    finally:
        stop_agents(procs)
