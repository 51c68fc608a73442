"""Run a job's regions on one machine: one ``training.worker`` group per region (each rank a
process with torchrun's environment, forked as ``tests.training.forked_ranks`` does), each region's
leader serving gRPC on 127.0.0.1 port 0 and publishing its address in a shared rendezvous
directory. Test scaffolding: the product launches workers through the agent."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX, parse_lines
from tests.processes import free_port
from tests.training.forked_ranks import Rank

REPO = Path(__file__).resolve().parents[2]


def region_configs(
    base: dict[str, Any],
    regions: list[str],
    sync: dict[str, Any],
    workdir: Path,
    nproc: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """One worker config per region from a shared ``base`` (model, data, training) and ``sync``
    section: replicas numbered region by region, peers found through ``workdir/rendezvous``."""
    nproc = nproc or {}
    total = sum(nproc.get(r, 1) for r in regions)
    out, offset = {}, 0
    for r in regions:
        cfg = copy.deepcopy(base)
        n = nproc.get(r, 1)
        cfg.update(region=r, cluster=f"{r}-c0", metrics_path=str(workdir / r / "metrics.jsonl"), device="cpu")
        cfg.setdefault("parallel", {})["dp_local"] = n
        cfg["sync"] = {
            **sync,
            "peers": dict.fromkeys(regions, ""),
            "rendezvous_dir": str(workdir / "rendezvous"),
            "global_replicas": total,
            "replica_offset": offset,
        }
        out[r] = cfg
        offset += n
    return out


@dataclass
class RegionProcess:
    region: str
    procs: list[Rank] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def wait(self, timeout: float) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def output(self) -> str:
        return self.logs[0].read_text() if self.logs and self.logs[0].exists() else ""

    def metrics(self) -> list[dict[str, Any]]:
        return parse_lines(self.output(), METRIC_PREFIX)

    def result(self) -> dict[str, Any] | None:
        res = parse_lines(self.output(), RESULT_PREFIX)
        return res[-1] if res else None


def start_region(
    cfg: dict[str, Any],
    workdir: Path,
    nproc: int = 1,
    tag: str = "",
    module: str = "training.worker",
    env_extra: dict[str, str] | None = None,
) -> RegionProcess:
    """Start one region's worker processes (non-blocking); output goes to ``workdir/<region>/``.
    ``module`` is what each rank runs (a test's own worker wraps ``training.worker``)."""
    region = cfg["region"]
    d = workdir / region
    d.mkdir(parents=True, exist_ok=True)
    path = d / "config.json"
    path.write_text(json.dumps(cfg))
    port = free_port()
    rp = RegionProcess(region)
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            **(env_extra or {}),
        }
        log = d / f"rank{rank}{tag}.log"
        rp.procs.append(Rank(["-m", module, "--config", str(path)], env, log, REPO))
        rp.logs.append(log)
    return rp


def run_regions(
    configs: dict[str, dict[str, Any]],
    workdir: Path,
    nproc: dict[str, int] | None = None,
    timeout: float = 600.0,
) -> dict[str, RegionProcess]:
    """Start every region, wait for all; returns the processes (outputs, metrics, results)."""
    nproc = nproc or {}
    procs = {r: start_region(cfg, workdir, nproc.get(r, 1)) for r, cfg in configs.items()}
    try:
        for rp in procs.values():
            rp.wait(timeout)
    finally:
        for rp in procs.values():
            rp.kill()
    return procs
