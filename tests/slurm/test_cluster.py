"""The test Slurm itself: it comes up, runs a batch job, and leaves no daemon behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.slurm.cluster import NODE_CPUS, SlurmCluster, missing_reason, running_slurm


def test_runs_a_batch_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    assert slurm.run("sinfo", "-h", "-N", "-o", "%N %c").split() == ["localhost", str(NODE_CPUS)]
    out = tmp_path / "out.txt"
    job = slurm.run("sbatch", "--parsable", f"--output={out}", "--wrap=echo hello from slurm").strip()
    while slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip():
        time.sleep(0.1)
    assert "JobState=COMPLETED" in slurm.run("scontrol", "show", "job", "-o", job)
    assert out.read_text().strip() == "hello from slurm"


def test_stop_leaves_no_daemon() -> None:
    if (reason := missing_reason()) is not None:
        pytest.skip(reason)
    with running_slurm() as cluster:
        procs = list(cluster.procs)
    assert all(p.poll() is not None for p in procs)
    for p in procs:
        assert not Path(f"/proc/{p.pid}").exists()
