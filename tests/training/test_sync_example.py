"""The public sync API's example, every mode: three processes, their own loop, and what the mode
promises at the end (the example checks it and exits non-zero otherwise)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ONE_MODEL = {"sync", "local_sgd", "diloco", "gossip"}


MODES = ["sync", "ssp", "local_sgd", "diloco", "async", "gossip"]


def test_sync_regions_example_keeps_each_modes_promise() -> None:
    """``--mode all``: every mode in turn in the same three region processes (each engine closed
    before the next starts), each checked as its own run would be."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sync_regions.py"), "--mode", "all"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith("{")] == MODES, lines
    printed = [ast.literal_eval(line) for line in lines if line.startswith("{")]
    for mode in MODES:
        (verdict,) = [line for line in lines if line.startswith(f"{mode}: ")]
        regions = [r for r in printed if r["mode"] == mode]
        assert sorted(r["region"] for r in regions) == ["a", "b", "c"], (mode, regions)
        # Loopback without TLS material: allowed, and every region's totals say it ran insecure.
        assert all(r["totals"]["insecure"] is True for r in regions), mode
        if mode in ONE_MODEL:
            assert verdict == f"{mode}: one model in every region: True"
            assert len({r["params"] for r in regions}) == 1, (mode, regions)
        else:
            key = "ssp_ahead" if mode == "ssp" else "async_lag_rounds"
            assert all(r[key] <= 1 for r in regions), (mode, regions)
            assert verdict.endswith(": True"), verdict


def test_the_example_builds_engines_only_through_the_public_constructor() -> None:
    source = (REPO / "examples" / "sync_regions.py").read_text()
    assert "create_engine(" in source and "SyncEngine" not in source
