"""``cpn agent --backend slurm`` as a process against a real control plane and a real Slurm: it
registers the cluster's free CPUs as its devices, runs a dispatched task as a batch job to
success with its metrics and result back, and sees its job cancelled outside cpn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestration.db.models import Accelerator
from resource_layer.liveness import node_alive_key
from tests.agent.conftest import REPO, AgentProcess, Launcher, Plane, close_plane, make_plane, node_of
from tests.agent.test_agent_process import FINISHING, dispatch, task_row, wait_status
from tests.resource_layer.harness import wait_for
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
