"""The test Slurm itself: it comes up, runs a batch job, and leaves no daemon behind."""

from __future__ import annotations

import contextlib
import os
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


def test_stop_leaves_no_daemon_and_no_job_process() -> None:
    """Stopped with a job running whose script has a child of its own: nothing is left."""
    if (reason := missing_reason()) is not None:
        pytest.skip(reason)
    with running_slurm() as cluster:
        procs = list(cluster.procs)
        job = cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap=sleep 600 & wait").strip()
        while "JobState=RUNNING" not in cluster.run("scontrol", "show", "job", "-o", job):
            time.sleep(0.1)
        mark = f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()
    assert all(p.poll() is not None for p in procs)
    for p in procs:
        assert not Path(f"/proc/{p.pid}").exists()
    left = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if int(environ.parent.name) != os.getpid() and mark in environ.read_bytes().split(b"\0"):
                left.append(environ.parent.name)
    assert left == []
