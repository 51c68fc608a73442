"""Real worker processes in three regions over gRPC: a region killed mid-run is dropped, the others
train on, and the region, started again, catches up from a peer and is included again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.training.sync_launch import region_configs, run_regions, start_region

REGIONS = ["eu-west", "sa-east", "us-east"]


@pytest.mark.slow
def test_killed_region_is_dropped_then_rejoins(tmp_path: Path) -> None:
    base = {
        "job_id": "fault",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": 1500, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    links = {"eu-west|us-east": {"bandwidth_mbps": 100, "latency_ms": 5}}
    cfgs = region_configs(
        base, REGIONS, {"mode": "diloco", "every": 10, "timeout_s": 4, "links": links}, tmp_path
    )
    procs = {r: start_region(c, tmp_path) for r, c in cfgs.items()}
    victim = procs["sa-east"]
    try:
        deadline = time.monotonic() + 120
        while not any(m["step"] >= 40 for m in victim.metrics()):
            assert time.monotonic() < deadline, victim.output()[-2000:]
            time.sleep(0.2)
        victim.kill()
        time.sleep(6)  # longer than timeout_s: the others must drop it
        back = start_region(cfgs["sa-east"], tmp_path, tag="-again")
        for r in ("eu-west", "us-east"):
            procs[r].wait(240)
        back.wait(240)
    finally:
        for p in [*procs.values()]:
            p.kill()
    for r in ("eu-west", "us-east"):
        res, metrics = procs[r].result(), procs[r].metrics()
        assert res is not None and res["steps"] == 1500, procs[r].output()[-3000:]
        assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    events = [e for m in procs["eu-west"].metrics() for e in m.get("sync", {}).get("events", [])]
    assert any(e.startswith("drop sa-east") for e in events), events
    assert any(e.startswith("rejoin sa-east") for e in events), events
    res = back.result()
    assert res is not None and res["steps"] == 1500, back.output()[-3000:]


def test_overlapped_diloco_workers_adapt_the_delay_alike(tmp_path: Path) -> None:
    # 40 ms a hop: a ring round (4 hops) takes many more steps of this tiny model than the one
    # step given, so from the second round the delay grows, by the same figures on every region.
    base = {
        "job_id": "adapt",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": 80, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    links = {f"{a}|{b}": {"latency_ms": 40} for a in REGIONS for b in REGIONS if a < b}
    sync = {"mode": "diloco", "every": 20, "overlap": True, "overlap_steps": 1, "links": links}
    procs = run_regions(region_configs(base, REGIONS, sync | {"compression": "int8"}, tmp_path), tmp_path)
    delays = {}
    for r, p in procs.items():
        res = p.result()
        assert res is not None and res["steps"] == 80, p.output()[-3000:]
        assert res["overlap_steps"] == max(m["sync"]["overlap_steps"] for m in p.metrics() if "sync" in m)
        delays[r] = {
            m["step"]: m["sync"]["overlap_steps"] for m in p.metrics() if "overlap_steps" in m.get("sync", {})
        }
    first = delays[REGIONS[0]]
    assert all(d == first for d in delays.values()), delays  # the same delay at every step, everywhere
    assert first[20] == 1 and 2 <= first[80] <= 19, first  # grown from the planner's, within a round


@pytest.mark.slow
@pytest.mark.parametrize("n_regions", [2, 3])
def test_gossip_run_ending_on_a_round_start_finishes(tmp_path: Path, n_regions: int) -> None:
    # Real worker processes, two ranks per region; the last step (20) is also a round start (H=5),
    # so the final mean follows a round's exchanges that may still be in flight. Every region ends
    # at step 20 well within the start-up timeout, on a final exchange of seconds, not minutes.
    regions = REGIONS[:n_regions]
    base = {
        "job_id": "gossip-end",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": 20, "local_batch": 4, "lr": 3e-3, "warmup": 2, "seed": 7},
    }
    sync = {"mode": "gossip", "every": 5, "timeout_s": 5, "startup_timeout_s": 60}
    cfgs = region_configs(base, regions, sync, tmp_path, nproc=dict.fromkeys(regions, 2))
    procs = {r: start_region(c, tmp_path, nproc=2) for r, c in cfgs.items()}
    try:
        for p in procs.values():
            p.wait(90)
    finally:
        for p in procs.values():
            p.kill()
    for r, p in procs.items():
        res, metrics = p.result(), p.metrics()
        assert res is not None and res["steps"] == 20, p.output()[-3000:]
        last = [m for m in metrics if m["step"] == 20]
        assert last and last[0]["sync_s"] < 20, (r, last)
