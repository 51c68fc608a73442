"""Planner benchmark: quote latency on generated fleets, and the optimality gap on small ones.

    python benchmarks/planner.py [--quotes 20] [--gap-instances 40] [--sizes 10,100,1000,10000]
                                 [--rest-quotes 30] [--sim-instances 60] [--sim-gap-instances 60]
                                 [--permutations 20] [--busy 0]

Prints the host's speed (``_host.host_loop_s``: a fixed Python loop, before and after the
latency runs) and p50/p95 quote latency per fleet size (10, 100, 1,000 and 10,000 clusters over
30 regions, the last about 420,000 free devices; jobs from 125M to 70B parameters), wall clock and
process CPU time (the machine may be shared), each p95 also scaled to the slower hosts of this
kind (``_at_slow_host``: × max(1, 1.1 s / the host loop)); the same quotes at 1,000 clusters
through REST on a `cpn server` process (PostgreSQL + Redis, the fleet registered over gRPC), and
REST's p95 over plan's; how far the best option's estimate moves when each fleet lists its
regions, clusters, nodes and links in another order (``--permutations`` per size up to 1,000
clusters); the optimality gap against exhaustive search on small instances, the estimates against
the event simulator (``sim_vs_planner.py``, with 20 instances whose pipelines span clusters and
regions: p90 of |planner iteration - sim step| / sim step) and the gap against every placement
scored by the simulator (``sim_gap.py``), then a final JSON line. ``--busy N``: N CPU-bound
loops run beside the whole benchmark, as other tenants' work on a shared host.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import MODELS, fleet, job, small_instance  # noqa: E402
from _host import at_slow_host, busy_loops, host_loop_s  # noqa: E402
from _rest_quotes import rest_latency  # noqa: E402
from sim_gap import sim_gap  # noqa: E402
from sim_vs_planner import iteration_s  # noqa: E402
from sim_vs_planner import run as sim_run  # noqa: E402

from contracts.errors import NoFeasiblePlan  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from control_layer.heap import settle_long_lived  # noqa: E402
from control_layer.planner import plan, prepare  # noqa: E402
from control_layer.planner.exhaustive import exhaustive_best, objective_key  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402

# Fleets this large are generated with room for every cluster (the default caps at 100,000).
MAX_DEVICES = 1_000_000


def sized_fleet(n_clusters: int, seed: int) -> ResourceSnapshot:
    return fleet(n_clusters, seed=seed, max_devices=MAX_DEVICES if n_clusters > 1000 else 100_000)


def latency(n_clusters: int, quotes: int, seed: int) -> dict:
    snap = sized_fleet(n_clusters, seed)
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


def permuted(snap: ResourceSnapshot, rng: random.Random) -> ResourceSnapshot:
    """The same fleet with its regions, clusters, each cluster's nodes and its links listed in
    another order."""
    raw = snap.model_dump()
    for key in ("regions", "clusters", "links"):
        rng.shuffle(raw[key])
    for cluster in raw["clusters"]:
        rng.shuffle(cluster["nodes"])
    return ResourceSnapshot.model_validate(raw)


def _best_duration(spec: JobSpec, snap: ResourceSnapshot) -> float | None:
    try:
        return plan(spec, snap)[0].estimates.duration_s
    except NoFeasiblePlan:
        return None


def listing_spread(n_clusters: int, quotes: int, permutations: int, seed: int) -> float:
    """The largest relative change of a quote's best option's estimated duration over
    ``permutations`` listings of its fleet (a quote feasible one way and not another counts 1)."""
    snap = sized_fleet(n_clusters, seed)
    rng = np.random.default_rng(seed)
    specs = [job(i % len(MODELS), rng) for i in range(quotes)]
    listed = [_best_duration(spec, snap) for spec in specs]
    shuffle = random.Random(seed)
    worst = 0.0
    for _ in range(permutations):
        other = permuted(snap, shuffle)
        for spec, base in zip(specs, listed, strict=True):
            got = _best_duration(spec, other)
            if (got is None) != (base is None):
                worst = 1.0
            elif got is not None and base is not None:
                worst = max(worst, abs(got - base) / base)
    return worst


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


def _latencies(args: argparse.Namespace, result: dict) -> None:
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


def _rest(args: argparse.Namespace, result: dict, loop_s: float) -> None:
    rng = np.random.default_rng(args.seed)  # the same job sequence as the plan-alone runs
    specs = [job(i % len(MODELS), rng).model_dump(mode="json") for i in range(args.rest_quotes)]
    r = rest_latency(fleet(1000, seed=args.seed), specs)
    slow = at_slow_host(r["p95_ms"], loop_s)
    print(
        f"REST {r['clusters']:>5} clusters {r['devices']:>7} devices: p50 {r['p50_ms']:8.1f} ms  "
        f"p95 {r['p95_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  (server CPU p50 {r['p50_cpu_ms']:.1f}, "
        f"p95 {r['p95_cpu_ms']:.1f} ms; {r['infeasible']}/{r['quotes']} infeasible; "
        f"{r['nodes_registered']} nodes registered over gRPC in {r['register_s']:.0f} s; "
        f"p95 at the slow host {slow:.1f} ms)"
    )
    result["rest_quote_p50_ms_1000_clusters"] = round(r["p50_ms"], 1)
    result["rest_quote_p95_ms_1000_clusters"] = round(r["p95_ms"], 1)
    result["rest_quote_p95_server_cpu_ms_1000_clusters"] = round(r["p95_cpu_ms"], 1)
    result["rest_quote_p95_ms_1000_clusters_at_slow_host"] = round(slow, 1)
    plan_p95 = result.get("p95_ms_1000_clusters")
    if plan_p95:  # the same host, the same load: how much the request path adds
        result["rest_over_plan_p95_1000_clusters"] = round(r["p95_ms"] / plan_p95, 2)


def _spread(args: argparse.Namespace, result: dict) -> None:
    sizes = [n for n in (int(s) for s in args.sizes.split(",")) if n <= 1000]
    spreads = {n: listing_spread(n, args.quotes, args.permutations, args.seed) for n in sizes}
    for n, spread in spreads.items():
        print(f"{n:>5} clusters: best option's estimate over {args.permutations} listings moves {spread:.2e}")
    result["listing_order_spread_max"] = max(spreads.values(), default=0.0)


def _quality(args: argparse.Namespace, result: dict) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quotes", type=int, default=20)
    ap.add_argument("--gap-instances", type=int, default=40)
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rest-quotes", type=int, default=30, help="quotes through REST at 1,000 clusters; 0 skips"
    )
    ap.add_argument("--sim-instances", type=int, default=60, help="small instances against the simulator")
    ap.add_argument("--sim-gap-instances", type=int, default=60)
    ap.add_argument("--permutations", type=int, default=20, help="listings of each fleet; 0 skips")
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound loops beside the whole benchmark")
    args = ap.parse_args()
    result: dict = {"busy_loops": args.busy}
    with busy_loops(args.busy):
        before = host_loop_s()
        _latencies(args, result)
        after = host_loop_s()
        loop_s = (before + after) / 2.0
        result["host_loop_s"] = round(loop_s, 3)
        scaled = {k: at_slow_host(v, loop_s) for k, v in result.items() if k.startswith("p95_ms_")}
        print(
            f"host loop (10M additions at module scope): {before:.3f} s before, {after:.3f} s after; "
            f"p95 scaled to the slower hosts of this kind (x {at_slow_host(1.0, loop_s):.2f}): "
            + ", ".join(f"{k.removeprefix('p95_ms_')} {v:.1f} ms" for k, v in scaled.items())
        )
        result.update({f"{k}_at_slow_host": round(v, 1) for k, v in scaled.items()})
        if args.rest_quotes > 0:
            _rest(args, result, loop_s)
        if args.permutations > 0:
            _spread(args, result)
        _quality(args, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
