"""Jobs over REST through a real Slurm: the control plane on PostgreSQL + Redis, a Slurm-backed
`cpn agent` for the one-node test cluster (the cheaper one) and a local-backend agent beside it,
torchrun workers training. The Slurm job of a running task is cancelled with ``scancel`` (as a
preemption by the cluster): the task is lost, not failed, and the job resumes from its
checkpoint on the other cluster, without spending a retry and losing at most ``checkpoint_every``
steps; the other users' jobs on the cluster are never touched. A drained node, or other users'
jobs holding every CPU, send cpn's jobs to the other cluster, and those jobs run on untouched."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestration.db.models import Accelerator, Cluster, Event, Node, TaskMetric
from service_layer.cli.demo import wait_for_clusters
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents
from tests.agent.conftest import REPO
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    wait_job,
)
from tests.slurm.cluster import NODE_CPUS, SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

EVERY = 10
STEPS = 300
SLURM_AGENT = ("--backend", "slurm", "--slurm", "partition=debug", "--slurm", "poll_s=0.3")


def job_spec() -> dict[str, Any]:
    return {
        "name": "slurm-gpt",
        "model": {"family": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "vocab": 32, "seq_len": 32},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": STEPS, "global_batch_tokens": 4 * 32, "lr": 3e-3, "checkpoint_every": EVERY},
        "parallelism": {"dp": 1, "tp": 1, "pp": 1, "zero": 0},
        "qos": {"max_hours": 1, "objective": "cost"},
    }


def slurm_job_of(workdir: Path, task_id: str) -> str:
    (path,) = workdir.glob(f"agent-eu-west-hpc-1/assignments/{task_id}/slurm_job_id")
    return path.read_text().strip()


def wait_checkpoint(client: Any, job_id: str, min_step: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert job["status"] not in TERMINAL, f"job ended early: {job['status']} {job['reason']}"
        if job["tasks"] and all((t["checkpoint_step"] or 0) >= min_step for t in job["tasks"]):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not checkpoint step {min_step} within {timeout_s}s")


def test_a_job_whose_slurm_job_is_cancelled_mid_run_resumes_from_its_checkpoint(
    slurm: SlurmCluster,
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", "hpc-1", "lumen", 0.5, "EU", measure_profile=False, extra_args=SLURM_AGENT),
        LocalAgent("eu-west", "paris-1", "atlas", 2.0, "EU", measure_profile=False),
    ]
    env = slurm.env | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    other = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", "--cpus-per-task=2", "--wrap=exec sleep 600"
    )
    procs = start_agents(specs, handle.grpc_target, enroll(client, specs, note="slurm"), tmp_path, 31400, env)
    try:
        wait_for_clusters(client, len(specs))
        job = (
            client.post("/v1/jobs", json={"spec": job_spec(), "choice": "cheapest"}).raise_for_status().json()
        )
        running = wait_checkpoint(client, job["id"], 2 * EVERY, timeout_s=240)
        (first,) = running["tasks"]
        slurm_job = slurm_job_of(tmp_path, first["id"])  # placed on the cheaper, Slurm-backed cluster
        at_cancel = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        step_at_cancel = (at_cancel["tasks"][0]["last_metrics"] or {}).get("step", 0)
        slurm.run("scancel", slurm_job)  # the cluster takes it away

        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert done["attempt"] == running["attempt"] + 1
        (final,) = done["tasks"]
        assert final["node_id"] != first["node_id"]  # re-placed off the cluster that lost it
        resumed = done["result"]["per_task"][final["id"]]["resumed_from"]
        assert resumed is not None and resumed >= 2 * EVERY and resumed % EVERY == 0
        assert step_at_cancel - resumed <= 2 * EVERY  # at most an interval lost (and a report's lag)
        with handle.ctx.session_factory() as session:
            failed = session.scalars(
                select(Event.payload).where(Event.job_id == job["id"], Event.kind == "task.failed")
            ).all()
            first_step = session.scalar(
                select(TaskMetric.step).where(TaskMetric.task_id == final["id"]).order_by(TaskMetric.step)
            )
        assert [(p["task_id"], p.get("lost")) for p in failed] == [(first["id"], True)]
        assert f"Slurm job {slurm_job} was cancelled outside cpn" in failed[0]["message"]
        assert done["preemptions"] == 1  # lost after a checkpoint: no retry spent
        assert first_step is not None and first_step > resumed
        # The other user's job ran throughout, untouched.
        assert "JobState=RUNNING" in slurm.run("scontrol", "show", "job", "-o", other.strip())
    finally:
        stop_agents(procs)
        slurm.run("scancel", other.strip(), check=False)


def _node_capacity(handle: Any, cluster: str) -> tuple[int, int]:
    """(devices registered, devices unavailable now) of the cluster's node."""
    with handle.ctx.session_factory() as session:
        node = session.scalars(
            select(Node).join(Cluster, Cluster.id == Node.cluster_id).where(Cluster.name == cluster)
        ).one()
        count = session.scalar(
            select(func.count()).select_from(Accelerator).where(Accelerator.node_id == node.id)
        )
        return int(count or 0), node.devices_unavailable


def _job_state(slurm: SlurmCluster, job: str) -> str:
    """A Slurm job's state and the reason Slurm gives for it."""
    fields = dict(
        kv.split("=", 1) for kv in slurm.run("scontrol", "show", "job", "-o", job).split() if "=" in kv
    )
    return f"{fields.get('JobState')} (reason {fields.get('Reason')}, exit {fields.get('ExitCode')})"


def _queue_wait(handle: Any, cluster: str) -> float:
    """The queue wait the cluster's node last reported (seconds)."""
    with handle.ctx.session_factory() as session:
        node = session.scalars(
            select(Node).join(Cluster, Cluster.id == Node.cluster_id).where(Cluster.name == cluster)
        ).one()
        return node.queue_wait_s


def _wait(check: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_drained_node_or_other_users_jobs_send_cpn_elsewhere_and_are_never_touched(
    slurm: SlurmCluster,
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The cheaper Slurm cluster drained (``scontrol update``): its agent reports every device
    unavailable and the job goes to the dearer cluster. Resumed, but with other users' jobs
    holding every CPU: the same, and their jobs run on undisturbed; once they end, a job lands on
    the Slurm cluster again."""
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", "hpc-1", "lumen", 0.5, "EU", measure_profile=False, extra_args=SLURM_AGENT),
        LocalAgent("eu-west", "paris-1", "atlas", 2.0, "EU", measure_profile=False),
    ]
    env = slurm.env | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = start_agents(specs, handle.grpc_target, enroll(client, specs, note="slurm"), tmp_path, 31500, env)
    others: list[str] = []
    short = job_spec() | {"training": job_spec()["training"] | {"steps": 20}}
    try:
        wait_for_clusters(client, len(specs))
        registered, _ = _node_capacity(handle, "hpc-1")
        assert registered == NODE_CPUS
        slurm.run("scontrol", "update", "NodeName=localhost", "State=DRAIN", "Reason=maintenance")
        _wait(lambda: _node_capacity(handle, "hpc-1")[1] == NODE_CPUS, "the drain reported")
        drained = (
            client.post("/v1/jobs", json={"spec": short, "choice": "cheapest"}).raise_for_status().json()
        )
        done = wait_job(client, drained["id"], TERMINAL, timeout_s=240)
        assert done["status"] == "succeeded", done["reason"]
        assert not list(tmp_path.glob("agent-eu-west-hpc-1/assignments/*"))  # nothing went to Slurm
        slurm.run("scontrol", "update", "NodeName=localhost", "State=RESUME")
        # the resume seen first: the drain's report reads as full as the other users' jobs will
        _wait(lambda: _node_capacity(handle, "hpc-1")[1] == 0, "the resume reported")

        others = [
            slurm.run(
                "sbatch", "--parsable", "--output=/dev/null", "--cpus-per-task=4", "--wrap=exec sleep 600"
            ).strip()
            for _ in range(2)
        ]
        _wait(lambda: all(_job_state(slurm, o).startswith("RUNNING") for o in others), "their jobs to run")
        _wait(lambda: _node_capacity(handle, "hpc-1")[1] == NODE_CPUS, "the other users' jobs reported")
        busy = client.post("/v1/jobs", json={"spec": short, "choice": "cheapest"}).raise_for_status().json()
        done = wait_job(client, busy["id"], TERMINAL, timeout_s=240)
        assert done["status"] == "succeeded", done["reason"]
        assert not list(tmp_path.glob("agent-eu-west-hpc-1/assignments/*"))
        for other in others:  # never cancelled, never held back
            state = _job_state(slurm, other)
            assert state.startswith("RUNNING"), f"job {other}: {state}"
        slurm.run("scancel", *others)
        _wait(lambda: _node_capacity(handle, "hpc-1")[1] == 0, "the CPUs back")
        # and no queue left: a wait estimated from the other users' jobs (their time limits) can
        # outlast the job's max_hours, which keeps the node out of the search until it is reported
        _wait(lambda: _queue_wait(handle, "hpc-1") == 0, "the queue wait back to none")
        free = client.post("/v1/jobs", json={"spec": short, "choice": "cheapest"}).raise_for_status().json()
        done = wait_job(client, free["id"], TERMINAL, timeout_s=240)
        assert done["status"] == "succeeded", done["reason"]
        (task,) = done["tasks"]
        assert slurm_job_of(tmp_path, task["id"])  # the cheaper cluster again, through sbatch
    finally:
        stop_agents(procs)
        slurm.run("scontrol", "update", "NodeName=localhost", "State=RESUME", check=False)
        if others:
            slurm.run("scancel", *others, check=False)
