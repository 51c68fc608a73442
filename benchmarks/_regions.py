"""Run a job's regions on this machine for a benchmark: one single-process worker per region
(``python -m training.worker``, a world of one), its leader serving gRPC on loopback and publishing
its address in a shared rendezvous directory."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.lifetime import tied_env
from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX, parse_lines

REPO = Path(__file__).resolve().parents[1]


def region_configs(
    base: dict[str, Any], regions: list[str], sync: dict[str, Any], workdir: Path
) -> dict[str, dict[str, Any]]:
    """One worker config per region from a shared ``base`` (model, data, training) and ``sync``
    section: one replica per region, numbered in order; peers found through ``workdir/rendezvous``."""
    out = {}
    for offset, r in enumerate(regions):
        cfg = copy.deepcopy(base)
        cfg.update(region=r, cluster=f"{r}-c0", metrics_path=str(workdir / r / "metrics.jsonl"), device="cpu")
        cfg["sync"] = {
            **sync,
            "peers": dict.fromkeys(regions, ""),
            "rendezvous_dir": str(workdir / "rendezvous"),
            "global_replicas": len(regions),
            "replica_offset": offset,
        }
        out[r] = cfg
    return out


@dataclass
class RegionRun:
    region: str
    returncode: int
    log: Path

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def metrics(self) -> list[dict[str, Any]]:
        return parse_lines(self.output(), METRIC_PREFIX)

    def result(self) -> dict[str, Any] | None:
        res = parse_lines(self.output(), RESULT_PREFIX)
        return res[-1] if res else None


def run_regions(configs: dict[str, dict[str, Any]], workdir: Path, timeout: float) -> dict[str, RegionRun]:
    """Start every region's worker, wait for all (killing any still running at ``timeout``)."""
    env = tied_env({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})  # they end with us
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for r, cfg in configs.items():
            d = workdir / r
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(cfg))
            log = d / "worker.log"
            with log.open("w") as f:
                cmd = [sys.executable, "-m", "training.worker", "--config", str(d / "config.json")]
                procs[r] = (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT), log)
        return {r: RegionRun(r, p.wait(timeout=timeout), log) for r, (p, log) in procs.items()}
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
