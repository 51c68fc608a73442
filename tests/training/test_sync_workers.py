"""Real worker processes in three regions over gRPC: a region killed mid-run is dropped, the others
train on, and the region, started again, catches up from a peer and is included again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.training.sync_launch import RegionProcess, region_configs, run_regions, start_region

REGIONS = ["eu-west", "sa-east", "us-east"]
KILLED_STEPS = 1200
# Each step of the fault tests sleeps this long (``paced_worker``): the survivors' progress is
# paced by the clock, not by this host's speed, so they are still training when the killed
# region comes back whether the host is fast or busy, without burning CPU on thousands of steps.
PACE = {"CPN_TEST_STEP_SLEEP_S": "0.01"}
PACED = "tests.training.paced_worker"


def _events(region: RegionProcess) -> list[str]:
    """The sync events a region's worker has reported so far."""
    return [e for m in region.metrics() for e in m.get("sync", {}).get("events", [])]


@pytest.mark.slow
def test_killed_region_is_dropped_then_rejoins(tmp_path: Path) -> None:
    base = {
        "job_id": "fault",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        # Long enough that the survivors, no longer waiting out timeouts for the killed region,
        # are still training when it comes back (at up to ~80 steps a second, paced, they readmit
        # it some 5 s after the kill: near step 450).
        "training": {"steps": KILLED_STEPS, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    links = {"eu-west|us-east": {"bandwidth_mbps": 100, "latency_ms": 5}}
    cfgs = region_configs(
        base,
        REGIONS,
        # blocking rounds, the same steps in every region: each region's result is the job's steps
        {"mode": "diloco", "every": 10, "overlap": False, "balance": False, "timeout_s": 4, "links": links},
        tmp_path,
    )
    procs = {r: start_region(c, tmp_path, module=PACED, env_extra=PACE) for r, c in cfgs.items()}
    victim = procs["sa-east"]
    try:
        deadline = time.monotonic() + 120
        while not any(m["step"] >= 40 for m in victim.metrics()):
            assert time.monotonic() < deadline, victim.output()[-2000:]
            time.sleep(0.2)
        victim.kill()
        while not any(e.startswith("drop sa-east") for e in _events(procs["eu-west"])):  # dropped first
            assert time.monotonic() < deadline + 60, procs["eu-west"].output()[-2000:]
            time.sleep(0.1)
        back = start_region(cfgs["sa-east"], tmp_path, tag="-again", module=PACED, env_extra=PACE)
        for r in ("eu-west", "us-east"):
            procs[r].wait(240)
        back.wait(240)
    finally:
        for p in [*procs.values()]:
            p.kill()
    for r in ("eu-west", "us-east"):
        res, metrics = procs[r].result(), procs[r].metrics()
        assert res is not None and res["steps"] == KILLED_STEPS, procs[r].output()[-3000:]
        assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    events = _events(procs["eu-west"])
    assert any(e.startswith("drop sa-east") for e in events), events
    assert any(e.startswith("rejoin sa-east") for e in events), events
    res = back.result()
    assert res is not None and res["steps"] == KILLED_STEPS, back.output()[-3000:]


def test_overlapped_diloco_workers_apply_each_round_when_it_arrives(tmp_path: Path) -> None:
    # 40 ms a hop: a ring round (4 hops, >= 0.16 s) takes several steps of this tiny model, more
    # than the one step of delay given. Each region applies a round at the first step its result is in (never
    # waiting at the delay) and at the latest where the next round opens; the run ends on one model.
    steps, every = 80, 20
    base = {
        "job_id": "arrival",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": steps, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    links = {f"{a}|{b}": {"latency_ms": 40} for a in REGIONS for b in REGIONS if a < b}
    sync = {"mode": "diloco", "every": every, "overlap": True, "overlap_steps": 1, "links": links}
    sync |= {"balance": False}  # rounds open at every H-th step in every region
    procs = run_regions(region_configs(base, REGIONS, sync | {"compression": "int8"}, tmp_path), tmp_path)
    for p in procs.values():
        res = p.result()
        assert res is not None and res["steps"] == steps, p.output()[-3000:]
        ms = {m["step"]: m for m in p.metrics()}
        landed = {
            s: m["sync"]["landed_after_steps"]
            for s, m in ms.items()
            if "landed_after_steps" in m.get("sync", {})
        }
        # rounds opened at 20, 40 and 60, each applied once, within its round; the last at the end
        assert len(landed) == 3 and all(len(v) == 1 for v in landed.values()), landed
        for s, (lag,) in landed.items():
            assert 2 <= lag <= every and (s - lag) % every == 0, landed  # not at the 1-step delay
            if lag < every:  # applied on arrival: its result was in, no wait for the exchange
                assert ms[s]["sync"]["landed_waiting"] == [False], ms[s]
        assert res["overlap_steps"] == landed[max(landed)][0]


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


@pytest.mark.slow
def test_survivors_do_not_wait_out_timeouts_for_a_killed_or_rejoining_region(tmp_path: Path) -> None:
    # As on the job path: DiLoCo H=20 overlapped, landing on arrival, a long timeout. A region is
    # killed with kill -9 and started again shortly after, ahead of where it died (as a replacement
    # starts from the survivors' step). The survivors find it gone from the refused connection and
    # admit it back at a round boundary: no whole timeout is waited out around either.
    # Paced, the survivors readmit the restarted region some 5 s after the kill (near step 350).
    timeout_s, steps = 20, 1200
    base = {
        "job_id": "prompt",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": steps, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    sync = {"mode": "diloco", "every": 20, "overlap": True, "overlap_steps": 2, "timeout_s": timeout_s}
    sync |= {"balance": False}  # every region's result is the job's step count
    cfgs = region_configs(base, REGIONS, sync, tmp_path)
    procs = {r: start_region(c, tmp_path, module=PACED, env_extra=PACE) for r, c in cfgs.items()}
    back = None
    try:
        deadline = time.monotonic() + 120
        while not any(m["step"] >= 100 for m in procs["sa-east"].metrics()):
            assert time.monotonic() < deadline, procs["sa-east"].output()[-2000:]
            time.sleep(0.1)
        procs["sa-east"].kill()
        time.sleep(2)
        at = max(m["step"] for r in ("eu-west", "us-east") for m in procs[r].metrics())
        again = {**cfgs["sa-east"], "checkpoint": {"start_step": at}}
        back = start_region(again, tmp_path, tag="-again", module=PACED, env_extra=PACE)
        for r in ("eu-west", "us-east"):
            procs[r].wait(240)
        back.wait(240)
    finally:
        for p in [*procs.values(), *([back] if back else [])]:
            p.kill()
    for r in ("eu-west", "us-east"):
        res, metrics = procs[r].result(), procs[r].metrics()
        assert res is not None and res["steps"] == steps, procs[r].output()[-3000:]
        # No step waits long (a round of this model takes well under a second), and around the
        # kill and the rejoin (from a round before the drop to two rounds after the readmission)
        # the waits add up to well below one timeout.
        worst = max((m["sync_s"], m["step"]) for m in metrics)
        assert worst[0] < 5, (r, worst)
        events = {m["step"]: m.get("sync", {}).get("events", []) for m in metrics}
        dropped = min(s for s, ev in events.items() if any(e.startswith("drop sa-east") for e in ev))
        back_at = max(s for s, ev in events.items() if any(e.startswith("rejoin sa-east") for e in ev))
        around = [m["sync_s"] for m in metrics if dropped - 20 <= m["step"] <= back_at + 40]
        assert sum(around) < 5, (r, sum(around), dropped, back_at)
    events = [e for m in procs["eu-west"].metrics() for e in m.get("sync", {}).get("events", [])]
    assert any(e.startswith("drop sa-east") for e in events), events
    assert any(e.startswith("rejoin sa-east") for e in events), events
    res = back.result()
    assert res is not None and res["steps"] == steps, back.output()[-3000:]
