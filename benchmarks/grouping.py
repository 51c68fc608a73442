"""Which nodes form each pipeline, on the issue's reference fleet, scored by the independent simulator.

    python benchmarks/grouping.py [--permutations 20] [--seed 0]

One datacenter of 64 GPUs: eight 4-GPU instances (100 Gb/s inside) and 32 single GPUs, every node
behind a 1.25 Gb/s NIC; a 1.3B GPT trained in ``sync`` mode, 1,024 sequences of 2,048 tokens a
step, at dp 8 × pp 8 (the layout the reference placements use) and at ``auto``. cpn once built
each replica from nodes in the order the fleet listed them, fastest port first: listed instances
first it took two instances per replica and left four replicas of eight single GPUs; listed each
instance followed by four single GPUs, it took one instance and four singles per replica.
Prints, per listing and permutation: the best option's step as estimated and as simulated
(``benchmarks/sim``, which shares no code with the planner), its grouping bound
(``PlanOption.grouping``) and the quote's time; and the same for the replicas cpn formed before,
in listing order (built here, priced by ``estimate_option``). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sim import simulate  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from control_layer.planner import estimate_option, plan  # noqa: E402
from control_layer.planner.placement import Placement  # noqa: E402
from control_layer.planner.plan_types import PlannedTask, PlanOption  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402

# What the simulator is given: the planner's own defaults (as ``sim_vs_planner``).
GOODPUT = {"lan_goodput": 0.9, "wan_goodput": 0.7, "call_s": 0.003, "param_s": 16e-9, "fixed_s": 0.010}
NIC_GBPS = 1.25


def _node(name: str, devices: int) -> dict:
    slots = [{"index": k, "model": "V100", "memory_gb": 32.0, "tflops": 110.0} for k in range(devices)]
    return {"id": name, "devices": slots, "fabric_bandwidth_gbps": NIC_GBPS}


def fleet(nodes: list[dict]) -> ResourceSnapshot:
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "dc"}],
            "clusters": [
                {
                    "id": "dc",
                    "region": "dc",
                    "nodes": nodes,
                    "intra_bandwidth_gbps": 100.0,
                    "price_per_device_hour": 1.0,
                }
            ],
        }
    )


QUADS = [_node(f"q{i}", 4) for i in range(8)]
SINGLES = [_node(f"s{i}", 1) for i in range(32)]
LISTINGS = {
    "instances first": QUADS + SINGLES,
    "each instance, then four singles": [
        n for i in range(8) for n in [QUADS[i], *SINGLES[4 * i : 4 * i + 4]]
    ],
}


def job(parallelism: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "gpt-1.3b",
            "model": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "vocab": 50304, "seq_len": 2048},
            "training": {"steps": 1000, "global_batch_tokens": 2048 * 1024, "micro_batch_size": 1},
            "parallelism": parallelism,
            "sync": {"mode": "sync"},
            "qos": {"objective": "time"},
        }
    )


def listed_replicas(nodes: list[dict], dp: int, pp: int) -> list[PlannedTask]:
    """The replicas cpn formed before the grouping search: nodes in listing order (all behind one
    port), each replica taking whole nodes until it holds pp stages."""
    tasks: list[PlannedTask] = []
    rank, stage = 0, 0
    for n in nodes:
        for d in range(len(n["devices"])):
            tasks.append(
                PlannedTask(
                    dp_rank=rank, pp_stage=stage, tp_rank=0, cluster="dc", node=n["id"], device=d, region="dc"
                )
            )
            stage += 1
            if stage == pp:
                rank, stage = rank + 1, 0
                break  # a node serves one replica: the rest of its devices stay idle
        if rank == dp:
            break
    return tasks


def _simulated(spec: JobSpec, option: PlanOption, snap: ResourceSnapshot) -> float:
    return simulate(
        spec.model_copy(
            update={"training": spec.training.model_copy(update={"precision": option.precision})}
        ),
        option,
        snap,
        **GOODPUT,
    ).step_s


def _row(label: str, spec: JobSpec, snap: ResourceSnapshot) -> dict:
    t0 = time.perf_counter()
    best = plan(spec, snap)[0]
    quote_s = time.perf_counter() - t0
    est = best.estimates.step_s.total - best.estimates.step_s.checkpoint
    bound = best.grouping
    return {
        "listing": label,
        "degrees": [best.dp, best.tp, best.pp],
        "est_step_s": round(est, 3),
        "sim_step_s": round(_simulated(spec, best, snap), 3),
        "gap": None if bound is None else round(bound.gap, 4),
        "exact": None if bound is None else bound.exact,
        "quote_s": round(quote_s, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--permutations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    result: dict = {}
    pinned = job({"dp": 8, "tp": 1, "pp": 8})
    for label, nodes in LISTINGS.items():
        snap = fleet(nodes)
        tasks = listed_replicas(nodes, 8, 8)
        est = estimate_option(Placement(pinned, snap, tasks, dp=8, tp=1, pp=8, zero=0))
        old = plan(pinned, snap)[0].model_copy(update={"tasks": tasks, "grouping": None})
        sim = _simulated(pinned, old, snap)
        iteration = est.step_s.total - est.step_s.checkpoint
        print(f"before, {label:>32}: est {iteration:7.2f} s  sim {sim:7.2f} s a step")
        result[f"before_{label.split()[0]}_sim_step_s"] = round(sim, 3)
    rng = random.Random(args.seed)
    for name, spec in (("pinned", pinned), ("auto", job("auto"))):
        rows = [_row(label, spec, fleet(nodes)) for label, nodes in LISTINGS.items()]
        rows += [
            _row(f"permutation {i}", spec, fleet(rng.sample(QUADS + SINGLES, 40)))
            for i in range(args.permutations)
        ]
        for r in rows:
            print(
                f"{name:>6} {r['listing']:>32}: dp,tp,pp {r['degrees']}  est {r['est_step_s']:7.2f} s  "
                f"sim {r['sim_step_s']:7.2f} s  gap {r['gap']}  exact {r['exact']}  quote {r['quote_s']:.2f}s"
            )
        ests = [r["est_step_s"] for r in rows]
        result[f"{name}_est_step_s"] = min(ests)
        result[f"{name}_sim_step_s"] = min(r["sim_step_s"] for r in rows)
        result[f"{name}_listing_spread"] = round(max(ests) / min(ests) - 1.0, 6)
        result[f"{name}_gap_max"] = max((r["gap"] or 0.0) for r in rows)
        result[f"{name}_quote_s_p50"] = round(float(np.percentile([r["quote_s"] for r in rows], 50)), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
