"""`cpn demo` stopped (SIGTERM) or killed (SIGKILL) while its agents measure their reference
steps leaves no process behind: not its agents, not the reference step's torchrun and rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import marked_env, wait_for_process, wait_until_gone

REPO = Path(__file__).resolve().parents[2]
# Each signal at a point of its own: SIGTERM as an agent starts its reference step, SIGKILL once
# the step's rank runs (torchrun starts it as `python -u`, in a session of its own).
POINTS = {signal.SIGTERM: "-m torch.distributed.run", signal.SIGKILL: "-u -m training.reference_step"}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_demo_ends_its_agents_and_their_reference_steps(tmp_path: Path, sig: signal.Signals) -> None:
    # TMPDIR: the demo's directory, and the host lock its agents take turns on, are this test's.
    env, mark = marked_env({**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)})
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "cpn", "demo"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_process(mark, "-m agent --server", count=3)
        wait_for_process(mark, POINTS[sig])
        demo.send_signal(sig)
        demo.wait(60)
        assert wait_until_gone(mark) == {}, log.read_text(errors="replace")[-3000:]
        if sig == signal.SIGTERM:  # stopped as Ctrl-C stops it, not killed by the signal
            assert demo.returncode != -signal.SIGTERM
            assert "Traceback" not in log.read_text(errors="replace")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
