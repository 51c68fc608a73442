"""cpn's own processes on the machine, told apart from other tenants' (``agent.cpn_threads``), and
the contention figure without their threads (``agent.contention``)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import contention
from agent.cpn_threads import CpnThreads, is_cpn_command

SPIN = "while True: pass"


def test_commands_of_agents_launchers_and_workers_are_cpns() -> None:
    own = [
        ["python", "-m", "agent", "--server", "x"],
        ["python3", "-u", "-m", "training.launch", "--nproc-per-node", "2"],
        ["/usr/bin/python3", "/usr/local/bin/cpn", "agent", "--server", "x"],
        ["/usr/local/bin/cpn", "agent"],
        ["python", "/srv/cpn/training/worker.py"],
    ]
    others = [
        ["python", "-c", "x", "-m", "agent"],  # "-m agent" as a script's argument
        ["python", "-m", "pytest"],
        ["/usr/local/bin/cpn", "server"],
        ["python", "-m", "torch.distributed.run", "-m", "training.reference_step"],  # cpn's by its parent
        ["bash"],
        [],
    ]
    assert [is_cpn_command(a) for a in own] == [True] * len(own)
    assert [is_cpn_command(a) for a in others] == [False] * len(others)


def _wait_for_child(pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("the launcher's child never started")


def test_a_launcher_and_what_it_started_are_cpns_another_tenants_spin_is_not(tmp_path: Path) -> None:
    script = tmp_path / "training" / "launch.py"  # a task's launcher, by its path
    script.parent.mkdir()
    script.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {SPIN!r}])\n")
    launcher = subprocess.Popen([sys.executable, str(script)])
    outsider = subprocess.Popen([sys.executable, "-c", SPIN])
    rank = None
    try:
        rank = _wait_for_child(launcher.pid)
        found = CpnThreads().own_pids()
        assert found is not None
        pids, _ = found
        assert {launcher.pid, rank} <= pids
        assert outsider.pid not in pids
        assert (CpnThreads().runnable() or 0) >= 1  # the rank spins: runnable, whether or not on a core
    finally:
        if rank is not None:
            os.kill(rank, signal.SIGKILL)  # the launcher's child: killed first, never orphaned
        for proc in (launcher, outsider):
            proc.kill()
            proc.wait()


def test_the_figure_leaves_cpns_runnable_threads_out() -> None:
    quiet = functools.partial(contention.probe, spin_s=0.005, max_wall_s=10.0, cores=8)
    for own, expect in ((lambda: 0, 5 / 8), (lambda: 2, 3 / 8), (lambda: 10, 1 / 8), (lambda: None, 5 / 8)):
        assert quiet(count=lambda: 5, own=own) == pytest.approx(expect)
    # Nothing else runs: nothing to take out, and cpn's threads are not counted (no /proc scan).
    asked: list[int] = []
    assert quiet(count=lambda: 1, own=lambda: asked.append(1) or 0) == pytest.approx(1 / 8)
    assert asked == []
