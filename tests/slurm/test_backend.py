"""The Slurm backend against a real one-node Slurm: a task runs as a batch job and its metrics
and result come back; a job cancelled outside cpn is seen and mapped; a cluster whose CPUs
another user's job holds keeps cpn's task queued, and that job is never touched."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.settings import AgentSettings
from agent.slurm import SlurmLauncher
from agent.slurm_cli import JobEnd, job_end_from_jobcomp, jobcomp_file, read_tail
from agent.workers import CANCELLED, FAILED, SUCCEEDED, Assignment, WorkerRun
from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX
from proto.cpn.agent.v1 import agent_pb2
from tests.slurm.cluster import NODE_CPUS, SlurmCluster

STARTING, RUNNING = agent_pb2.TASK_STATE_STARTING, agent_pb2.TASK_STATE_RUNNING
# A stand-in worker: two metric lines and a result, or (``hold``) a line, then a long sleep.
WORKER = f"""
import json, os, sys, time
print({METRIC_PREFIX!r} + json.dumps({{"step": 1, "loss": 2.0}}), flush=True)
if sys.argv[1] == "hold":
    print("holding", flush=True)
    time.sleep(600)
print({METRIC_PREFIX!r} + json.dumps({{"step": 2, "loss": 1.5}}), flush=True)
print({RESULT_PREFIX!r} + json.dumps({{"final_loss": 1.5, "job": os.environ["CPN_JOB_ID"]}}), flush=True)
"""


@pytest.fixture
def slurm_env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The agent's Slurm tools (and the jobs it submits) reach the test cluster."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    return slurm


def _run(tmp_path: Path, mode: str, nproc: int, sent: list[agent_pb2.AgentMessage]) -> WorkerRun:
    settings = AgentSettings(
        server="127.0.0.1:50051", region="eu-west", cluster="hpc", price_per_device_hour=1.0,
        work_dir=tmp_path / "agent", metrics_min_interval_s=0.0, allow_command_override=True,
        kill_grace_s=1.0,
    )  # fmt: skip
    # The quote's time limit, as the control plane puts it in every task's config.
    config = {
        "command": [sys.executable, "-c", WORKER, mode],
        "training": {"steps": 2},
        "time_limit_s": 850.0,
    }
    a = Assignment(f"task-{mode}", "job-slurm", 1, (), nproc, config)
    launcher = SlurmLauncher(poll_s=0.2)
    return WorkerRun(
        a,
        settings.work_dir / "run",
        settings=settings,
        device_kind="cpu",
        send=sent.append,
        launcher=launcher,
    )


def _statuses(sent: list[agent_pb2.AgentMessage]) -> list[tuple[int, str]]:
    return [
        (m.task_status.state, m.task_status.message) for m in sent if m.WhichOneof("kind") == "task_status"
    ]


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.05)


def _job_id(run: WorkerRun) -> str:
    return (run.run_dir / "slurm_job_id").read_text().strip()


def test_a_task_runs_as_a_batch_job(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    sent: list[agent_pb2.AgentMessage] = []
    run = _run(tmp_path, "done", 2, sent)
    asyncio.run(asyncio.wait_for(run.run(), 120))
    status = run.current.task_status
    assert status.state == SUCCEEDED, (status.message, (run.run_dir / "worker.log").read_text())
    job = _job_id(run)
    states = [s for s, _ in _statuses(sent)]
    assert states.index(RUNNING) > states.index(STARTING) and states[-1] == SUCCEEDED
    assert (STARTING, f"queued as slurm job {job}") in _statuses(sent)
    steps = [m.metrics.step for m in sent if m.WhichOneof("kind") == "metrics"]
    assert steps and steps[-1] == 2
    assert json.loads(status.result_json)["final_loss"] == 1.5
    assert json.loads(status.result_json)["job"] == "job-slurm"  # the agent's worker environment
    record = slurm_env.run("scontrol", "show", "job", "-o", job)
    assert "JobState=COMPLETED" in record and "NumCPUs=2" in record and "Name=cpn-task-done" in record
    assert "TimeLimit=00:15:00" in record  # the quote's 850 s, in whole minutes up


def test_a_job_cancelled_outside_cpn_is_seen_and_mapped(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    sent: list[agent_pb2.AgentMessage] = []
    run = _run(tmp_path, "hold", 1, sent)

    async def scenario() -> None:
        task = asyncio.create_task(run.run())
        await _until(lambda: any(m.log.line == "holding" for m in sent if m.WhichOneof("kind") == "log"))
        slurm_env.run("scancel", _job_id(run))  # the cluster's operator, say
        await asyncio.wait_for(task, 120)

    asyncio.run(asyncio.wait_for(scenario(), 180))
    status = run.current.task_status
    assert status.state == FAILED  # as a lost node's task: the control plane re-places it
    assert status.message == f"Slurm job {_job_id(run)} was cancelled outside cpn (scancel)"
    assert status.lost  # taken away, not failed by its workers: the control plane is told so


def test_another_users_job_keeps_the_task_queued(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    """Every CPU held by a job cpn did not submit: cpn's task waits in Slurm's queue (STARTING),
    runs once that job ends, and the other job runs undisturbed until its owner ends it."""
    other = slurm_env.run(
        "sbatch", "--parsable", "--output=/dev/null", f"--cpus-per-task={NODE_CPUS}", "--wrap=exec sleep 600"
    ).strip()
    sent: list[agent_pb2.AgentMessage] = []
    run = _run(tmp_path, "done", 2, sent)

    async def scenario() -> None:
        task = asyncio.create_task(run.run())
        await _until(lambda: (run.run_dir / "slurm_job_id").exists())
        job = _job_id(run)
        await _until(lambda: "Reason=Resources" in slurm_env.run("scontrol", "show", "job", "-o", job))
        assert run.current.task_status.state == STARTING and not task.done()
        assert "JobState=RUNNING" in slurm_env.run("scontrol", "show", "job", "-o", other)
        slurm_env.run("scancel", other)  # its owner ends it
        await asyncio.wait_for(task, 120)

    asyncio.run(asyncio.wait_for(scenario(), 180))
    assert run.current.task_status.state == SUCCEEDED
    assert "JobState=CANCELLED" in slurm_env.run("scontrol", "show", "job", "-o", other)


def test_a_cancel_while_queued_withdraws_the_job(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    other = slurm_env.run(
        "sbatch", "--parsable", "--output=/dev/null", f"--cpus-per-task={NODE_CPUS}", "--wrap=exec sleep 600"
    ).strip()
    sent: list[agent_pb2.AgentMessage] = []
    run = _run(tmp_path, "done", 2, sent)

    async def scenario() -> None:
        task = asyncio.create_task(run.run())
        await _until(lambda: any(msg.startswith("queued as") for _, msg in _statuses(sent)))
        await run.stop("cancelled by its user")
        await asyncio.wait_for(task, 60)

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        slurm_env.run("scancel", other)
    assert _statuses(sent)[-1] == (CANCELLED, "cancelled by its user") and not run.current.task_status.lost
    assert RUNNING not in [s for s, _ in _statuses(sent)]
    assert "JobState=CANCELLED" in slurm_env.run("scontrol", "show", "job", "-o", _job_id(run))


def test_where_accounting_is_off_a_jobs_end_is_read_from_the_jobcomp_file(slurm_env: SlurmCluster) -> None:
    """The test cluster keeps no accounting (``sacct`` refuses) and writes ``jobcomp/filetxt``:
    the launcher finds the file through ``scontrol show config``, and a job's end is read there."""
    job = slurm_env.run("sbatch", "--parsable", "--output=/dev/null", "--wrap=exit 3").strip()

    async def ended() -> JobEnd | None:
        path = await jobcomp_file()
        assert path == str(slurm_env.root / "jobcomp.txt")
        while (end := job_end_from_jobcomp(read_tail(path), job)) is None:
            await asyncio.sleep(0.1)
        return end

    assert asyncio.run(asyncio.wait_for(ended(), 60)) == JobEnd("FAILED", 3, 0)
    assert slurm_env.run("sacct", "-j", job, check=False) == ""  # no accounting to ask


def test_a_task_not_started_within_the_quotes_tolerance_is_given_up_as_lost(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    """Its config's ``start_within_s`` passes while another user's job holds every CPU: cpn
    cancels its own queued job (never the other) and reports the task lost, to be re-placed."""
    other = slurm_env.run(
        "sbatch", "--parsable", "--output=/dev/null", f"--cpus-per-task={NODE_CPUS}", "--wrap=exec sleep 600"
    ).strip()
    sent: list[agent_pb2.AgentMessage] = []
    run = _run(tmp_path, "done", 2, sent)
    run.assignment.worker_config["start_within_s"] = 2.0
    try:
        asyncio.run(asyncio.wait_for(run.run(), 120))
        status = run.current.task_status
        job = _job_id(run)
        assert (status.state, status.lost) == (FAILED, True)
        assert (
            status.message == f"slurm job {job} did not start within 2s (the quoted queue wait's tolerance)"
        )
        assert RUNNING not in [s for s, _ in _statuses(sent)]
        assert "JobState=CANCELLED" in slurm_env.run("scontrol", "show", "job", "-o", job)
        assert "JobState=RUNNING" in slurm_env.run("scontrol", "show", "job", "-o", other)
    finally:
        slurm_env.run("scancel", other)
