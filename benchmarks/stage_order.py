"""Searched stage orders against fastest-port-first, scored by the independent simulator.

    python benchmarks/stage_order.py [--instances 30] [--seed 0]

Generated fleets of one cluster whose nodes (two 24 GB devices each) declare their own ports into
the fabric (5 to 400 Gb/s, or the cluster's), and a model no node holds a replica of, so the
planner's spanning options place each replica on whole nodes. For every such option, the
replicas' nodes are laid out fastest port first (the listed order) and in the order the planner's
search picks (``stage_order.search_orders``); both are priced by ``estimate_option`` and run
through the simulator (``benchmarks/sim``). Prints one JSON line: how many options the search
reordered, how many of those the simulator finds faster, the same, or slower, the simulated gain,
and the estimate's error against the simulator in either order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sim import simulate  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from control_layer.planner import estimate_option  # noqa: E402
from control_layer.planner.fleet import filter_fleet  # noqa: E402
from control_layer.planner.local_step import replica_walks  # noqa: E402
from control_layer.planner.placement import Placement  # noqa: E402
from control_layer.planner.plan_types import PlannedTask, PlanOption  # noqa: E402
from control_layer.planner.search import precision_groups, with_precision  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402
from control_layer.planner.spanning import spanning_options  # noqa: E402
from control_layer.planner.stage_order import blocks, search_orders  # noqa: E402

# What the simulator is given: the planner's own defaults (as ``sim_vs_planner``).
GOODPUT = {"lan_goodput": 0.9, "wan_goodput": 0.7, "call_s": 0.003, "param_s": 16e-9, "fixed_s": 0.010}
PORTS = [5.0, 10.0, 25.0, 100.0, 200.0, 400.0, None]


def instance(seed: int) -> tuple[JobSpec, ResourceSnapshot]:
    rng = np.random.default_rng(30_000 + seed)
    devs = [{"index": k, "model": "A10", "memory_gb": 24, "tflops": 120} for k in range(2)]
    nodes = [
        {"id": f"n{i}", "devices": devs, "fabric_bandwidth_gbps": PORTS[int(rng.integers(len(PORTS)))]}
        for i in range(int(rng.integers(4, 9)))
    ]
    snap = ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r"}],
            "clusters": [
                {
                    "id": "c",
                    "region": "r",
                    "price_per_device_hour": 1.0,
                    "intra_bandwidth_gbps": float(rng.choice([100.0, 200.0, 400.0])),
                    "nodes": nodes,
                }
            ],
        }
    )
    spec = JobSpec.model_validate(
        {
            "name": "stage-order",
            "model": {
                "n_layers": int(rng.choice([16, 32])),
                "d_model": int(rng.choice([3072, 4096])),
                "n_heads": 32,
                "vocab": 32000,
                "seq_len": 1024,
            },
            "training": {"steps": 100, "global_batch_tokens": 1024 * int(rng.choice([32, 64, 128]))},
            "sync": {"mode": "sync", "compression": "none"},
        }
    )
    return spec, snap


def _listed(option: PlanOption, snap: ResourceSnapshot) -> list[list[tuple[str, str, int]]]:
    """Each replica's slots with its nodes fastest port first (ties in listing order)."""
    cluster = snap.clusters[0]
    nodes = {n.id: (i, n) for i, n in enumerate(cluster.nodes)}

    def rank(block: tuple) -> tuple:
        i, node = nodes[block[0][1]]
        gbps, lat = cluster.port(node)
        return (-gbps, lat, i)

    out = []
    for r in range(option.dp):
        mine = sorted((t for t in option.tasks if t.dp_rank == r), key=lambda t: (t.pp_stage, t.tp_rank))
        slots = [(t.cluster, t.node, t.device) for t in mine]
        out.append([s for b in sorted(blocks(slots), key=rank) for s in b])
    return out


def _tasks(replicas: list[list[tuple[str, str, int]]], tp: int) -> list[PlannedTask]:
    return [
        PlannedTask(dp_rank=r, pp_stage=i // tp, tp_rank=i % tp, cluster=c, node=n, device=d, region="r")
        for r, slots in enumerate(replicas)
        for i, (c, n, d) in enumerate(slots)
    ]


def _score(
    spec: JobSpec, snap: ResourceSnapshot, option: PlanOption, tasks: list[PlannedTask]
) -> tuple[float, float]:
    """(estimated iteration, simulated step) of the option's devices in this order."""
    o = option
    est = estimate_option(
        Placement(spec, snap, tasks, dp=o.dp, tp=o.tp, pp=o.pp, zero=o.zero), runtime=o.runtime
    )
    sim = simulate(spec, o.model_copy(update={"tasks": tasks}), snap, **GOODPUT).step_s
    return est.step_s.total - est.step_s.checkpoint, sim


def run(instances: int, seed: int) -> dict:
    gains, err_listed, err_searched, options = [], [], [], 0
    for k in range(instances):
        spec, snap = instance(seed + k)
        for precision, pools in precision_groups(spec, filter_fleet(spec, snap).pools):
            spec_p = with_precision(spec, precision)
            seen = set()
            for o in spanning_options(spec_p, snap, pools, None):
                devices = frozenset((t.node, t.device) for t in o.tasks)
                if (o.dp, o.tp, o.pp, devices) in seen:
                    continue  # the listed and the searched option of one placement: scored once
                seen.add((o.dp, o.tp, o.pp, devices))
                options += 1
                listed = _listed(o, snap)
                walks = replica_walks(
                    Placement(spec_p, snap, _tasks(listed, o.tp), dp=o.dp, tp=o.tp, pp=o.pp, zero=o.zero)
                )
                searched = search_orders(listed, o.tp, walks, snap, None)
                est_l, sim_l = _score(spec_p, snap, o, _tasks(listed, o.tp))
                err_listed.append(abs(est_l - sim_l) / sim_l)
                if searched == listed:
                    err_searched.append(err_listed[-1])
                    continue
                est_s, sim_s = _score(spec_p, snap, o, _tasks(searched, o.tp))
                err_searched.append(abs(est_s - sim_s) / sim_s)
                gains.append((sim_l - sim_s) / sim_l)
    g = np.array(gains) if gains else np.zeros(1)
    return {
        "instances": instances,
        "options": options,
        "reordered": len(gains),
        "sim_faster": int((g > 1e-3).sum()) if gains else 0,
        "sim_same": int((np.abs(g) <= 1e-3).sum()) if gains else 0,
        "sim_slower": int((g < -1e-3).sum()) if gains else 0,
        "sim_gain_p50": round(float(np.percentile(g, 50)), 4),
        "sim_gain_max": round(float(g.max()), 4),
        "sim_gain_min": round(float(g.min()), 4),
        "est_err_p90_listed": round(float(np.percentile(err_listed, 90)), 4) if err_listed else None,
        "est_err_p90_searched": round(float(np.percentile(err_searched, 90)), 4) if err_searched else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(run(args.instances, args.seed)))


if __name__ == "__main__":
    main()
