"""Planner benchmark: quote latency on generated fleets, and the optimality gap on small ones.

    python benchmarks/planner.py [--quotes 20] [--gap-instances 40] [--sizes 10,100,1000] [--rest-quotes 30]
                                 [--sim-instances 60] [--sim-gap-instances 60]

Prints p50/p95 quote latency per fleet size (10, 100, 1,000 clusters over 30 regions; jobs from
125M to 70B parameters), wall clock and process CPU time (the machine may be shared), the same
quotes at 1,000 clusters through REST on a `cpn server` process (PostgreSQL + Redis, the fleet
registered over gRPC), the optimality gap against exhaustive search on small instances, the
estimates against the event simulator (``sim_vs_planner.py``, with 20 instances whose pipelines
span clusters and regions: p90 of |planner iteration - sim
step| / sim step) and the gap against every placement scored by the simulator (``sim_gap.py``),
then a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import MODELS, fleet, job, small_instance  # noqa: E402
from _rest_quotes import rest_latency  # noqa: E402
from sim_gap import sim_gap  # noqa: E402
from sim_vs_planner import iteration_s  # noqa: E402
from sim_vs_planner import run as sim_run  # noqa: E402

from contracts.errors import NoFeasiblePlan  # noqa: E402
from control_layer.heap import settle_long_lived  # noqa: E402
from control_layer.planner import plan, prepare  # noqa: E402
from control_layer.planner.exhaustive import exhaustive_best, objective_key  # noqa: E402


def latency(n_clusters: int, quotes: int, seed: int) -> dict:
    snap = fleet(n_clusters, seed=seed)
    # As the server does once its in-memory fleet is loaded (control_layer/live_snapshot.py).
    prepare(snap)
    settle_long_lived()
    rng = np.random.default_rng(seed)
    times, cpu, infeasible = [], [], 0
    for i in range(quotes):
        spec = job(i % len(MODELS), rng)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            plan(spec, snap)
        except NoFeasiblePlan:
            infeasible += 1
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return {
        "clusters": n_clusters,
        "devices": sum(c.n_free for c in snap.clusters),
        "quotes": quotes,
        "infeasible": infeasible,
        "p50_ms": float(np.percentile(times, 50)),
        "p95_ms": float(np.percentile(times, 95)),
        "max_ms": float(max(times)),
        "p50_cpu_ms": float(np.percentile(cpu, 50)),
        "p95_cpu_ms": float(np.percentile(cpu, 95)),
    }


def gap(instances: int) -> dict:
    gaps, compared = [], 0
    for seed in range(instances):
        spec, snap = small_instance(seed)
        ref = exhaustive_best(spec, snap)
        try:
            best = plan(spec, snap)[0]
        except NoFeasiblePlan:
            best = None
        if ref is None or best is None:
            if (ref is None) != (best is None):
                gaps.append(float("inf"))
            continue
        compared += 1
        gaps.append(objective_key(spec, best)[0] / objective_key(spec, ref)[0] - 1.0)
    return {"instances": instances, "compared": compared, "max_gap": max(gaps, default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quotes", type=int, default=20)
    ap.add_argument("--gap-instances", type=int, default=40)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rest-quotes", type=int, default=30, help="quotes through REST at 1,000 clusters; 0 skips"
    )
    ap.add_argument("--sim-instances", type=int, default=60, help="small instances against the simulator")
    ap.add_argument("--sim-gap-instances", type=int, default=60)
    args = ap.parse_args()
    result: dict = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        r = latency(n, args.quotes, args.seed)
        print(
            f"{r['clusters']:>5} clusters {r['devices']:>7} devices: p50 {r['p50_ms']:8.1f} ms  "
            f"p95 {r['p95_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  "
            f"(CPU p50 {r['p50_cpu_ms']:.1f}, p95 {r['p95_cpu_ms']:.1f} ms; "
            f"{r['infeasible']}/{r['quotes']} infeasible)"
        )
        result[f"p50_ms_{n}_clusters"] = round(r["p50_ms"], 1)
        result[f"p95_ms_{n}_clusters"] = round(r["p95_ms"], 1)
        result[f"p95_cpu_ms_{n}_clusters"] = round(r["p95_cpu_ms"], 1)
    if args.rest_quotes > 0:
        rng = np.random.default_rng(args.seed)  # the same job sequence as the plan-alone runs
        specs = [job(i % len(MODELS), rng).model_dump(mode="json") for i in range(args.rest_quotes)]
        r = rest_latency(fleet(1000, seed=args.seed), specs)
        print(
            f"REST {r['clusters']:>5} clusters {r['devices']:>7} devices: p50 {r['p50_ms']:8.1f} ms  "
            f"p95 {r['p95_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  (server CPU p50 {r['p50_cpu_ms']:.1f}, "
            f"p95 {r['p95_cpu_ms']:.1f} ms; {r['infeasible']}/{r['quotes']} infeasible; "
            f"{r['nodes_registered']} nodes registered over gRPC in {r['register_s']:.0f} s)"
        )
        result["rest_quote_p50_ms_1000_clusters"] = round(r["p50_ms"], 1)
        result["rest_quote_p95_ms_1000_clusters"] = round(r["p95_ms"], 1)
        result["rest_quote_p95_server_cpu_ms_1000_clusters"] = round(r["p95_cpu_ms"], 1)
    g = gap(args.gap_instances)
    print(
        f"optimality gap vs exhaustive search: max {g['max_gap']:.4%} over {g['compared']} feasible instances"
    )
    result["max_optimality_gap"] = g["max_gap"]
    result["gap_instances_compared"] = g["compared"]
    sim = sim_run(argparse.Namespace(small=args.sim_instances, medium=12, spanning=20, shuffles=0, seed=0))
    errs = [abs(iteration_s(est) - r.step_s) / r.step_s for _, _, est, r in sim["rows"]]
    print(
        f"estimates vs simulator: p50 {np.percentile(errs, 50):.4f}, p90 {np.percentile(errs, 90):.4f} "
        f"over {len(errs)} options of {sim['instances']} instances"
    )
    result["sim_estimate_err_p90"] = round(float(np.percentile(errs, 90)), 4)
    result["sim_options_compared"] = len(errs)
    sg = sim_gap(args.sim_gap_instances)
    print(
        f"gap vs every placement scored by the simulator: max {sg['max_gap']:.4%} over {sg['compared']} "
        f"instances ({sg['skipped']} with more than the enumeration cap left out)"
    )
    result["max_optimality_gap_vs_sim"] = round(sg["max_gap"], 4)
    result["sim_gap_instances_compared"] = sg["compared"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
