"""``cpn agent --backend slurm`` as a process against a real control plane and a real Slurm: it
registers the cluster's free CPUs as its devices, runs a dispatched task as a batch job to
success with its metrics and result back (a stand-in worker, and torchrun over the training
worker), sees its job cancelled outside cpn, and waits behind another user's job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from control_layer.dispatch import assignment_message
from orchestration.db.models import Accelerator, Node, Task
from resource_layer.liveness import node_alive_key
from tests.agent.conftest import REPO, AgentProcess, Launcher, Plane, close_plane, make_plane, node_of
from tests.agent.test_agent_process import FINISHING, dispatch, task_row, wait_status
from tests.resource_layer.harness import add_task, wait_for
from tests.slurm.cluster import NODE_CPUS, SlurmCluster

HOLDING = """
import time
print("holding", flush=True)
time.sleep(600)
"""


@pytest.fixture
def slurm_agent(slurm: SlurmCluster, tmp_path: Path) -> Iterator[tuple[Plane, AgentProcess]]:
    plane = make_plane(tmp_path)
    start = Launcher(plane, tmp_path)
    env = slurm.env | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        agent = start(env=env, backend="slurm", slurm="partition=debug")
        yield plane, agent
    finally:
        start.stop_all()
        close_plane(plane)


def test_the_agent_registers_the_clusters_cpus_and_runs_a_task_through_sbatch(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    plane, agent = slurm_agent
    node = node_of(plane)
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what="the agent's stream")
    with plane.ctx.session_factory() as s:
        devices = s.scalars(select(Accelerator).where(Accelerator.node_id == node.id)).all()
    assert sorted(d.index for d in devices) == list(range(NODE_CPUS)) and {
        (d.kind, d.memory_gb) for d in devices
    } == {("cpu", 1.0)}

    task_id = dispatch(plane, node, FINISHING)
    task = wait_status(plane, task_id, "succeeded", "failed", timeout=120)
    assert task.status == "succeeded", task.message
    assert task.result is not None and task.result["loss_end"] == 1.0
    assert task.last_metrics is not None and task.last_metrics["step"] == 3
    run_dir = agent.work_dir / "assignments" / task_id
    job = (run_dir / "slurm_job_id").read_text().strip()
    assert "JobState=COMPLETED" in slurm.run("scontrol", "show", "job", "-o", job)
    assert "[stdout] hello from the worker" in (run_dir / "worker.log").read_text()


def test_a_task_whose_job_is_cancelled_outside_cpn_fails_with_the_reason(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    plane, agent = slurm_agent
    node = node_of(plane)
    task_id = dispatch(plane, node, HOLDING)
    wait_status(plane, task_id, "running", timeout=120)
    job_file = agent.work_dir / "assignments" / task_id / "slurm_job_id"
    wait_for(job_file.exists, what="the Slurm job id")
    job = job_file.read_text().strip()
    slurm.run("scancel", job)
    task = wait_status(plane, task_id, "failed", "cancelled", "succeeded", timeout=60)
    assert task.status == "failed"
    assert task.message == f"Slurm job {job} was cancelled outside cpn (scancel)", task_row(plane, task_id)


def test_the_normal_path_runs_torchrun_over_the_training_worker_in_the_job(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    """No command override: the batch job is ``torchrun -m training.worker`` on a tiny GPT."""
    plane, agent = slurm_agent
    node = node_of(plane)
    cfg = {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "device": "cpu",
           "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 8},
           "training": {"steps": 4, "local_batch": 2}}  # fmt: skip
    _, task_id = add_task(
        plane.ctx.session_factory, node.id, node.cluster_id, "eu-west", cfg, device_indices=[0]
    )
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", assignment_message(task))
    task = wait_status(plane, task_id, "succeeded", "failed", timeout=180)
    assert task.status == "succeeded", task.message
    assert task.result is not None and task.result["steps"] == 4
    assert task.last_metrics is not None and task.last_metrics["step"] == 4
    script = (agent.work_dir / "assignments" / task_id / "slurm_job.sh").read_text()
    assert "training.launch --standalone --nproc-per-node 1 -m training.worker" in script


def test_another_users_job_keeps_the_task_starting_until_it_ends(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    """cpn waits behind a job it did not submit, and never touches it."""
    plane, agent = slurm_agent
    node = node_of(plane)
    other = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", f"--cpus-per-task={NODE_CPUS}", "--wrap=exec sleep 600"
    ).strip()
    task_id = dispatch(plane, node, FINISHING)
    job_file = agent.work_dir / "assignments" / task_id / "slurm_job_id"
    wait_for(job_file.exists, what="the Slurm job id")
    job = job_file.read_text().strip()
    wait_for(
        lambda: "Reason=Resources" in slurm.run("scontrol", "show", "job", "-o", job),
        what="cpn's job to wait for resources",
    )
    wait_for(
        lambda: task_row(plane, task_id).message == f"queued as slurm job {job}", what="the queued status"
    )
    assert task_row(plane, task_id).status == "starting"
    assert "JobState=RUNNING" in slurm.run("scontrol", "show", "job", "-o", other)
    slurm.run("scancel", other)  # its owner ends it
    task = wait_status(plane, task_id, "succeeded", "failed", timeout=120)
    assert task.status == "succeeded", task.message


def test_a_restarted_agent_cancels_the_job_its_killed_predecessor_left(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """An agent killed outright cannot cancel its jobs; the next one on its work dir does (from
    the state file), and reports the task failed."""
    plane = make_plane(tmp_path)
    start = Launcher(plane, tmp_path)
    env = slurm.env | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        first = start(env=env, backend="slurm")
        node = node_of(plane)
        task_id = dispatch(plane, node, HOLDING)
        wait_status(plane, task_id, "running", timeout=120)
        job = (first.work_dir / "assignments" / task_id / "slurm_job_id").read_text().strip()
        first.kill()  # SIGKILL: its Slurm job, not a process of its group, runs on
        assert "JobState=RUNNING" in slurm.run("scontrol", "show", "job", "-o", job)
        start(env=env, backend="slurm", token="")
        task = wait_status(plane, task_id, "failed", timeout=60)
        assert "agent restarted" in task.message
        wait_for(
            lambda: "JobState=CANCELLED" in slurm.run("scontrol", "show", "job", "-o", job),
            what="the left job to be cancelled",
        )
    finally:
        start.stop_all()
        close_plane(plane)


def _unavailable(plane: Plane, node_id: str) -> int:
    with plane.ctx.session_factory() as s:
        node = s.get(Node, node_id)
        assert node is not None
        return node.devices_unavailable


def test_the_agent_reports_what_other_users_and_a_drain_leave_free_as_it_changes(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    """Free capacity is re-read on every heartbeat: another user's job takes devices from cpn,
    cpn's own running task does not, a drained node takes them all, and they come back."""
    plane, _ = slurm_agent
    node = node_of(plane)
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what="the agent's stream")
    other = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", "--cpus-per-task=5", "--wrap=exec sleep 600"
    ).strip()
    wait_for(lambda: _unavailable(plane, node.id) == 5, timeout=30, what="5 devices reported unavailable")
    task_id = dispatch(plane, node, HOLDING)  # one CPU of cpn's own: not counted against it
    wait_status(plane, task_id, "running", timeout=120)
    # Slurm allocates its CPU a moment before the agent sees the job run: 6 for a heartbeat or so.
    wait_for(lambda: _unavailable(plane, node.id) == 5, timeout=30, what="cpn's own CPU not counted")
    slurm.run("scontrol", "update", "NodeName=localhost", "State=DRAIN", "Reason=maintenance")
    try:
        wait_for(lambda: _unavailable(plane, node.id) == 7, timeout=30, what="the drained node's devices")
    finally:
        slurm.run("scontrol", "update", "NodeName=localhost", "State=RESUME")
    slurm.run("scancel", other)  # its owner ends it
    wait_for(lambda: _unavailable(plane, node.id) == 0, timeout=30, what="the devices back")
    assert task_row(plane, task_id).status == "running"  # a drain lets running jobs finish


def _queue_wait(plane: Plane, node_id: str) -> float:
    with plane.ctx.session_factory() as s:
        node = s.get(Node, node_id)
        assert node is not None
        return node.queue_wait_s


def test_the_agent_reports_the_queue_wait_and_its_task_the_wait_it_measured(
    slurm: SlurmCluster, slurm_agent: tuple[Plane, AgentProcess]
) -> None:
    """Another user's job holds every CPU for at most 5 minutes: the cluster's queue wait is
    about those minutes (two significant digits); a task queued behind it reports the wait it
    measured against the one expected; with the CPUs back the wait is the scheduler's latency."""
    plane, _ = slurm_agent
    node = node_of(plane)
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what="the agent's stream")
    assert _queue_wait(plane, node.id) == 0.0
    other = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", "--time=5", f"--cpus-per-task={NODE_CPUS}",
        "--wrap=exec sleep 600",
    ).strip()  # fmt: skip
    wait_for(lambda: 240 <= _queue_wait(plane, node.id) <= 300, timeout=30, what="a wait of about 5 minutes")
    task_id = dispatch(plane, node, FINISHING)
    wait_for(
        lambda: task_row(plane, task_id).message.startswith("queued as slurm job"), what="the queued task"
    )
    slurm.run("scancel", other)  # its owner ends it early
    task = wait_status(plane, task_id, "succeeded", "failed", timeout=120)
    assert task.status == "succeeded", task.message
    assert task.result is not None and 240 <= task.result["queue_wait_estimate_s"] <= 300
    assert 0 < task.result["queue_wait_s"] < task.result["queue_wait_estimate_s"]  # it ended early
    wait_for(lambda: _queue_wait(plane, node.id) < 10, timeout=30, what="the latency alone")
