"""The public sync API's example runs: three processes, their own loop, one model at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sync_regions_example_ends_with_one_model() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sync_regions.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "one model in every region: True" in p.stdout
