"""The public sync API's example, every mode: three processes, their own loop, and what the mode
promises at the end (the example checks it and exits non-zero otherwise)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ONE_MODEL = {"sync", "local_sgd", "diloco", "gossip"}


@pytest.mark.parametrize("mode", ["sync", "ssp", "local_sgd", "diloco", "async", "gossip"])
def test_sync_regions_example_keeps_each_modes_promise(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sync_regions.py"), "--mode", mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    regions = [ast.literal_eval(line) for line in lines[:-1]]
    assert sorted(r["region"] for r in regions) == ["a", "b", "c"]
    # Loopback without TLS material: allowed, and every region's totals say it ran insecure.
    assert all(r["totals"]["insecure"] is True for r in regions)
    if mode in ONE_MODEL:
        assert lines[-1] == f"{mode}: one model in every region: True"
        assert len({r["params"] for r in regions}) == 1
    else:
        key = "ssp_ahead" if mode == "ssp" else "async_lag_rounds"
        assert all(r[key] <= 1 for r in regions), regions
        assert lines[-1].endswith(": True")


def test_the_example_builds_engines_only_through_the_public_constructor() -> None:
    source = (REPO / "examples" / "sync_regions.py").read_text()
    assert "create_engine(" in source and "SyncEngine" not in source
