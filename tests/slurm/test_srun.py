"""Tasks over several Slurm nodes: the split, the per-node torchrun and the batch script (pure),
and a real srun group (one node here) training the tiny GPT through torchrun's rendezvous."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path

import pytest

from agent.launchers import TaskShape
from agent.settings import AgentSettings
from agent.slurm import SlurmLauncher, sbatch_args
from agent.slurm_srun import NodeSplit, split_over_nodes, srun_script, torchrun_per_node
from agent.workers import SUCCEEDED, Assignment, WorkerRun
from proto.cpn.agent.v1 import agent_pb2
from tests.slurm.cluster import SlurmCluster

STANDALONE = [sys.executable, "-m", "training.launch", "--standalone", "--nproc-per-node", "16",
              "-m", "training.worker", "--config", "/w/run dir/worker_config.json"]  # fmt: skip


def test_a_task_takes_the_fewest_nodes_holding_equal_shares() -> None:
    assert split_over_nodes(4, 8) == NodeSplit(1, 4)
    assert split_over_nodes(16, 8) == NodeSplit(2, 8)
    assert split_over_nodes(12, 8) == NodeSplit(2, 6)
    assert split_over_nodes(17, 8) == NodeSplit(17, 1)  # a prime: one process on each of 17 nodes
    assert split_over_nodes(9, 0) == NodeSplit(1, 9)  # the node size unknown: one node


def test_the_per_node_torchrun_takes_its_rank_and_rendezvous_from_slurm() -> None:
    cmd = torchrun_per_node(STANDALONE, 2, 8)
    assert cmd == [sys.executable, "-m", "training.launch", "--nnodes", "2", "--node-rank",
                   "$SLURM_NODEID", "--master-addr", "$CPN_RDZV_HOST", "--master-port", "$CPN_RDZV_PORT",
                   "--nproc-per-node", "8", "-m", "training.worker", "--config",
                   "/w/run dir/worker_config.json"]  # fmt: skip
    with pytest.raises(ValueError, match="only a torchrun command"):
        torchrun_per_node(["python", "-c", "print(1)"], 2, 1)
    with pytest.raises(ValueError, match="only a standalone torchrun"):
        torchrun_per_node([sys.executable, "-m", "training.launch", "--nnodes", "2"], 2, 1)


def test_the_batch_script_starts_one_torchrun_per_node_under_srun() -> None:
    script = srun_script(STANDALONE, NodeSplit(2, 8))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert 'CPN_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    assert "CPN_RDZV_PORT=$((20000 + SLURM_JOB_ID % 20000))" in lines
    srun = shlex.split(lines[-1])
    assert srun[:6] == [
        "exec",
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
    ]
    assert srun[6:8] == ["sh", "-c"] and len(srun) == 9
    inner = srun[8]  # as each node's sh sees it: Slurm's variables expand there, the path stays one word
    assert '--node-rank "$SLURM_NODEID" --master-addr "$CPN_RDZV_HOST"' in inner
    assert shlex.split(inner)[-1] == "/w/run dir/worker_config.json"
    shape = TaskShape("a1", nproc=16, gpus=16, time_limit_s=3600)
    args = sbatch_args(shape, cwd=Path("/w"), partition="gpu", account="", split=NodeSplit(2, 8))
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--gres=gpu:8", "--time=60"} <= set(args)


def test_a_real_srun_group_trains_through_torchruns_rendezvous(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--slurm srun=1``: the task is an srun step of a torchrun per node (one node here, two
    processes), meeting at the node Slurm's node list names first."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    settings = AgentSettings(
        server="127.0.0.1:50051", region="eu-west", cluster="hpc", price_per_device_hour=1.0,
        work_dir=tmp_path / "agent", metrics_min_interval_s=0.0, kill_grace_s=1.0,
    )  # fmt: skip
    config = {"job_id": "j", "region": "eu-west", "cluster": "hpc", "device": "cpu",
              "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 8},
              "training": {"steps": 3, "local_batch": 2}, "parallel": {"dp_local": 2}}  # fmt: skip
    sent: list[agent_pb2.AgentMessage] = []
    launcher = SlurmLauncher(poll_s=0.2, srun=True)
    run = WorkerRun(
        Assignment("srun-group", "j", 1, (), 2, config),
        settings.work_dir / "run",
        settings=settings,
        device_kind="cpu",
        send=sent.append,
        launcher=launcher,
    )
    asyncio.run(asyncio.wait_for(run.run(), 240))
    status = run.current.task_status
    assert status.state == SUCCEEDED, status.message
    result = json.loads(status.result_json)
    assert result["steps"] == 3
    script = (run.run_dir / "slurm_job.sh").read_text()
    assert "exec srun --nodes=1 --ntasks=1" in script and "--nproc-per-node 2" in script
    job = (run.run_dir / "slurm_job_id").read_text().strip()
    record = slurm.run("scontrol", "show", "job", "-o", job)
    assert "JobState=COMPLETED" in record and "NumCPUs=2" in record
