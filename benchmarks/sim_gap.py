"""The planner's best option against every placement of a small instance, all scored by the simulator.

    python benchmarks/sim_gap.py [--instances 60] [--seed 0]

For each small instance (``_common.small_instance``) the reference enumerates every degree the
planner may choose (``candidates.enumerate_degrees``: the runtime's shape rules) and every way of
putting dp replicas on nodes (a replica whole on one node, as the runtime runs it; nodes of one
cluster with equal free devices are interchangeable, so only one order of them is tried). Each
placement the estimator accepts (memory, links) is scored by the simulator: duration = steps x
the simulated step + what one iteration leaves out (start-up, teardown, the last exchange and the
checkpoint writes, as the estimator prices them with the runtime settings the placement's workers
would get), cost = the devices' hourly price over that duration plus the egress of the simulated
exchanges' bytes. The planner's option for the spec's objective is scored the same way; the gap
is its score over the best placement's - 1.
Placements for the reference sync around clusters in (region, cluster id) order, and gossip
around that ring; the planner's option keeps the ring and graph it ships.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import small_instance  # noqa: E402

from benchmarks.sim import simulate  # noqa: E402
from benchmarks.sim.simulate import PERIODIC  # noqa: E402
from contracts.errors import CpnError  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from control_layer.planner import plan  # noqa: E402
from control_layer.planner.candidates import enumerate_degrees  # noqa: E402
from control_layer.planner.estimate import estimate_planned  # noqa: E402
from control_layer.planner.fleet import filter_fleet  # noqa: E402
from control_layer.planner.placement import Placement  # noqa: E402
from control_layer.planner.plan_types import Estimates, PlannedTask, PlanOption  # noqa: E402
from control_layer.planner.search import precision_groups, with_precision  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402

# The constants sim_vs_planner gives the simulator (the planner's own defaults).
GOODPUT = {"lan_goodput": 0.9, "wan_goodput": 0.7, "call_s": 0.003, "param_s": 16e-9, "fixed_s": 0.010}
# An instance with more placements than this is left out (reported), not sampled.
MAX_PLACEMENTS = 4000

Node = tuple[str, str, str, tuple[int, ...], float]  # region, cluster id, node id, free indices, $/h


def outside_iteration_s(est: Estimates) -> float:
    """Seconds of a run that no iteration holds: what the simulator does not model."""
    return est.startup_s + est.teardown_s + est.final_sync_s + est.steps * est.step_s.checkpoint


def sim_score(
    spec: JobSpec, option: PlanOption, snap: ResourceSnapshot, price: dict[str, float], outside_s: float
) -> tuple:
    """(duration s, cost USD) of the whole run with every iteration as the simulator runs it."""
    sim = simulate(spec, option, snap, **GOODPUT)
    steps = spec.training.steps
    duration = steps * sim.step_s + outside_s
    hourly = sum(price[t.cluster] for t in option.tasks)
    every = option.sync.every if option.sync.mode in PERIODIC else 1
    exchanges = math.ceil(steps / every)
    egress = 0.0
    for label, nbytes in sim.wan_link_bytes.items():
        if label.startswith("link:"):
            a, b = label[len("link:") :].split("->")
            if a != b:
                link = snap.link(a, b)
                egress += nbytes / 1e9 * (link.egress_price_per_gb if link else 0.0) * exchanges
    cost = hourly * duration / 3600.0 + egress
    return (duration, cost) if spec.qos.objective == "time" else (cost, duration)


def _distributions(nodes: list[Node], cap: list[int], dp: int) -> Iterator[list[int]]:
    """Replicas per node summing to dp; interchangeable nodes (same cluster, same capacity) in
    non-increasing order only."""
    rest = [sum(cap[i:]) for i in range(len(cap))] + [0]

    def rec(i: int, left: int, acc: list[int]) -> Iterator[list[int]]:
        if left == 0:
            yield acc + [0] * (len(cap) - i)
            return
        if i == len(cap) or rest[i] < left:
            return
        same = i > 0 and nodes[i - 1][1] == nodes[i][1] and cap[i - 1] == cap[i]
        top = min(cap[i], left, acc[-1] if same else cap[i])
        for k in range(top, -1, -1):
            yield from rec(i + 1, left - k, [*acc, k])

    yield from rec(0, dp, [])


def _placements(
    spec: JobSpec, snap: ResourceSnapshot, template: PlanOption
) -> Iterator[tuple[JobSpec, PlanOption]]:
    filtered = filter_fleet(spec, snap)
    for precision, pools in precision_groups(spec, filtered.pools):
        spec_p = with_precision(spec, precision)
        nodes: list[Node] = sorted(
            (p.region, p.cluster.id, node, ix, p.price) for p in pools for node, ix in p.nodes
        )
        n_devices = sum(len(n[3]) for n in nodes)
        biggest = max((len(n[3]) for n in nodes), default=0)
        degrees, _, _ = enumerate_degrees(spec_p, n_devices, biggest)
        ring = list(dict.fromkeys(n[1] for n in nodes))
        for deg in degrees:
            per = deg.tp * deg.pp
            cap = [len(n[3]) // per for n in nodes]
            for counts in _distributions(nodes, cap, deg.dp):
                tasks, rank = [], 0
                for node, k in zip(nodes, counts, strict=True):
                    for j in range(k):
                        for i, dev in enumerate(node[3][j * per : (j + 1) * per]):
                            tasks.append(
                                PlannedTask(
                                    dp_rank=rank,
                                    pp_stage=i // deg.tp,
                                    tp_rank=i % deg.tp,
                                    cluster=node[1],
                                    node=node[2],
                                    device=dev,
                                    region=node[0],
                                )
                            )
                        rank += 1
                used = list(dict.fromkeys(t.cluster for t in tasks))
                per_replica = spec_p.global_batch_sequences // deg.dp
                yield (
                    spec_p,
                    template.model_copy(
                        update={
                            "dp": deg.dp,
                            "tp": deg.tp,
                            "pp": deg.pp,
                            "zero": deg.zero,
                            "precision": precision,
                            "n_micro_batches": max(1, per_replica // spec_p.training.micro_batch_size),
                            "tasks": tasks,
                            "sync": template.sync.model_copy(
                                update={"ring": [c for c in ring if c in used], "gossip": {}}
                            ),
                        }
                    ),
                )


def instance_gap(spec: JobSpec, snap: ResourceSnapshot) -> dict:
    try:
        options = plan(spec, snap)
    except CpnError:
        return {"status": "infeasible"}
    best = options[0]  # the option for the spec's objective comes first
    clusters = snap.clusters_by_id()
    price = {
        c.id: (
            min(c.price_per_device_hour, c.spot_price_per_device_hour)
            if spec.qos.preemptible and c.spot_price_per_device_hour is not None
            else c.price_per_device_hour
        )
        for c in snap.clusters
    }
    candidates = list(_placements(spec, snap, best))
    if len(candidates) > MAX_PLACEMENTS:
        return {"status": "too_many", "placements": len(candidates)}
    ref, scored = None, 0
    for spec_p, o in candidates:
        spot = spec.qos.preemptible and any(
            clusters[t.cluster].spot_price_per_device_hour is not None for t in o.tasks
        )
        try:
            est, runtime = estimate_planned(
                Placement(
                    spec_p,
                    snap,
                    o.tasks,
                    dp=o.dp,
                    tp=o.tp,
                    pp=o.pp,
                    zero=o.zero,
                    pp_schedule=o.pp_schedule,
                    spot=spot,
                )
            )
        except CpnError:  # does not fit, or no link: not a placement the runtime can run
            continue
        scored += 1
        # The runtime settings this placement's workers would get (overlap, checkpoint interval).
        o = o.model_copy(update={"runtime": runtime})
        s = sim_score(spec_p, o, snap, price, outside_iteration_s(est))
        ref = s if ref is None or s < ref else ref
    mine = sim_score(spec, best, snap, price, outside_iteration_s(best.estimates))
    if ref is None:
        return {"status": "no_reference"}
    return {"status": "ok", "gap": mine[0] / ref[0] - 1.0, "placements": scored}


def sim_gap(instances: int, seed: int = 0) -> dict:
    gaps, skipped = [], 0
    for i in range(instances):
        r = instance_gap(*small_instance(seed + i))
        if r["status"] == "ok":
            gaps.append(r["gap"])
        elif r["status"] != "infeasible":
            skipped += 1
    return {
        "instances": instances,
        "compared": len(gaps),
        "skipped": skipped,
        "max_gap": max(gaps, default=0.0),
        "gaps": gaps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = sim_gap(args.instances, args.seed)
    worst = sorted(r["gaps"], reverse=True)[:5]
    print(f"worst gaps: {[round(g, 4) for g in worst]}")
    print(
        json.dumps(
            {
                "max_optimality_gap_vs_sim": round(r["max_gap"], 4),
                "sim_gap_instances_compared": r["compared"],
                "sim_gap_instances_skipped": r["skipped"],
            }
        )
    )


if __name__ == "__main__":
    main()
