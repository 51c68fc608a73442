"""A torchrun group whose replicas hold one stage on several nodes reduces that stage's gradients
across those nodes' own ports (``group_rings``): the estimate agrees with the independent
simulator, which routes each ring hop through the devices' ports (``benchmarks/sim/links.py``).
Before, every such ring was priced at the cluster's fabric: single devices behind 1.25 Gb/s were
priced at 100 Gb/s (a 4-replica group over them 0.60 s a step against 4.10 s simulated)."""

from __future__ import annotations

import random

from benchmarks.sim import simulate
from control_layer.planner import estimate_option
from control_layer.planner.node_groups import node_groups
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import PlannedTask
from control_layer.planner.snapshot import ResourceSnapshot
from tests.control_layer.planner.test_node_group_pricing import GOODPUT, SPEC, _iteration, _option

PORTS = [None, 1.25, 10.0, 100.0]


def _case(rng: random.Random) -> tuple[ResourceSnapshot, list[PlannedTask], int, int]:
    """r replicas of pp stages: each stage on one node holding all r (an island) or on r nodes of
    one device each; at least one of each kind, so the replicas are one group whose rings cross
    nodes at some stage."""
    r, pp = rng.choice([2, 4]), rng.choice([2, 4])
    kinds = [rng.random() < 0.5 for _ in range(pp)]
    kinds[0], kinds[-1] = True, False  # an island and a spread stage at least
    rng.shuffle(kinds)
    nodes: list[dict] = []
    tasks: list[PlannedTask] = []
    for stage, island in enumerate(kinds):
        holders = [(len(nodes), q) for q in range(r)] if island else [(len(nodes) + q, 0) for q in range(r)]
        for q, (node, device) in enumerate(holders):
            tasks.append(
                PlannedTask(
                    dp_rank=q,
                    pp_stage=stage,
                    tp_rank=0,
                    cluster="c",
                    node=f"n{node}",
                    device=device,
                    region="r",
                )
            )
        for _ in range(1 if island else r):
            devices = [
                {"index": k, "model": "H100", "memory_gb": 80, "tflops": 400}
                for k in range(r if island else 1)
            ]
            nodes.append(
                {"id": f"n{len(nodes)}", "devices": devices, "fabric_bandwidth_gbps": rng.choice(PORTS)}
            )
    snap = ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r"}],
            "clusters": [
                {
                    "id": "c",
                    "region": "r",
                    "price_per_device_hour": 2.0,
                    "intra_bandwidth_gbps": 100.0,
                    "nodes": nodes,
                }
            ],
        }
    )
    return snap, tasks, r, pp


def _errors(seed: int, n: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        snap, tasks, r, pp = _case(rng)
        assert len(node_groups(tasks)) == 1
        est = estimate_option(Placement(SPEC, snap, tasks, dp=r, tp=1, pp=pp, zero=0))
        sim = simulate(SPEC, _option(tasks, r, 1, pp, est), snap, **GOODPUT)
        step = abs(_iteration(est) - sim.step_s) / sim.step_s
        dp = abs(est.step_s.dp_comm - sim.dp_sync_s) / max(sim.dp_sync_s, 1e-9)
        out.append((step, dp))
    return out


def test_groups_whose_stage_rings_cross_node_ports_are_priced_within_ten_percent_of_the_simulator() -> None:
    errors = _errors(3, 40)
    steps = sorted(e for e, _ in errors)
    assert steps[int(0.9 * len(steps))] <= 0.10, steps[-5:]
    assert steps[-1] <= 0.15


def _with_single_ports(snap: ResourceSnapshot, gbps: float | None) -> ResourceSnapshot:
    raw = snap.model_dump()
    for n in raw["clusters"][0]["nodes"]:
        if len(n["devices"]) == 1:
            n["fabric_bandwidth_gbps"] = gbps
    return ResourceSnapshot.model_validate(raw)


def test_a_slow_port_in_a_group_s_stage_ring_slows_its_gradient_reduce() -> None:
    snap, tasks, r, pp = _case(random.Random(0))
    fast, slow = (
        estimate_option(Placement(SPEC, _with_single_ports(snap, gbps), tasks, dp=r, tp=1, pp=pp, zero=0))
        for gbps in (None, 1.25)
    )
    assert slow.step_s.dp_comm > 10 * fast.step_s.dp_comm
