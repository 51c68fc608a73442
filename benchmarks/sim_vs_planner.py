"""The planner's step-time estimates against the event simulator (benchmarks/sim), on generated fleets.

    python benchmarks/sim_vs_planner.py [--small 60] [--medium 12] [--spanning 20] [--shuffles 6] [--seed 0]

Plans random small jobs on generated fleets (``_common.small_instance``: up to 6 small clusters in up
to 4 regions; ``_common.fleet``: 16-cluster fleets with 125M/1.3B jobs; ``_common.spanning_instance``:
2 to 4 clusters of narrow nodes in 2 or 3 regions, every node declared reachable from other
clusters, a job no node holds, so pipelines run across clusters and regions) with the real planner,
scores every returned option with the simulator, and compares term by term. For rank correlation
it also deals the first option's (replica, stage, tp rank) roles to random free devices of the
same model anywhere in the fleet, and has both the planner (``estimate_option``) and the simulator
price each: a cost model that ranks placements must agree with the reference on which is faster.

The simulator is given the planner's own device efficiency (0.5), link goodputs (0.9 inside a
region, 0.7 between regions), fixed seconds per sync call (3 ms) and the leaders' seconds per
parameter of an exchange (16 ns) as inputs, so differences come from what each models, not from
those constants. Ends with a JSON line:
{"instances", "options", "sim_estimate_err_p50", "sim_estimate_err_p90", "rank_corr", ...,
"cross_region_options", "cross_region_err_p90"}
where err = |planner iteration - sim step_s| / sim step_s over every option. The planner's
iteration is its step without the amortised checkpoint writes, which the simulator (one training
iteration) does not model; the error with them is reported too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import fleet, job, small_instance, spanning_instance  # noqa: E402

from benchmarks.sim import simulate  # noqa: E402


def iteration_s(step) -> float:
    """The planner's step without its amortised checkpoint writes: one iteration, as simulated."""
    return step.total - step.checkpoint


from contracts.errors import CpnError  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from control_layer.planner import estimate_option, plan  # noqa: E402
from control_layer.planner.placement import Placement  # noqa: E402
from control_layer.planner.plan_types import PlanOption  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402

# planner term -> simulator term
TERMS = {
    "compute": "compute_s",
    "tp_comm": "tp_comm_s",
    "pp_bubble": "bubble_s",
    "pp_comm": "pp_comm_s",
    "dp_comm": "dp_sync_s",
    "wan_sync": "wan_sync_s",
}
GOODPUT = {"lan_goodput": 0.9, "wan_goodput": 0.7, "call_s": 0.003, "param_s": 16e-9, "fixed_s": 0.010}


def instances(
    n_small: int, n_medium: int, seed: int, n_spanning: int = 0
) -> list[tuple[str, JobSpec, ResourceSnapshot]]:
    out = [(f"small-{i}", *small_instance(seed + i)) for i in range(n_small)]
    out += [(f"span-{i}", *spanning_instance(seed + i)) for i in range(n_spanning)]
    for i in range(n_medium):
        rng = np.random.default_rng(seed + 1000 + i)
        snap = fleet(16, seed=seed + 1000 + i, max_devices=512)
        out.append((f"fleet16-{i}", job(int(rng.integers(2)), rng), snap))
    return out


def shuffled(option: PlanOption, snap: ResourceSnapshot, rng: np.random.Generator) -> list | None:
    """The option's roles dealt at random to free devices of its device model anywhere in the fleet."""
    first = option.tasks[0]
    model = next(
        d.model
        for c in snap.clusters
        for n in c.nodes
        for d in n.devices
        if (c.id, n.id, d.index) == (first.cluster, first.node, first.device)
    )
    slots = [
        (c.id, n.id, d.index, c.region)
        for c in snap.clusters
        for n in c.nodes
        if n.alive
        for d in n.devices
        if d.free and d.model == model
    ]
    if len(slots) < len(option.tasks):  # the option mixes device models across replicas
        return None
    pick = rng.choice(len(slots), size=len(option.tasks), replace=False)
    return [
        t.model_copy(update=dict(zip(("cluster", "node", "device", "region"), slots[j], strict=True)))
        for t, j in zip(option.tasks, pick, strict=True)
    ]


def run(args: argparse.Namespace) -> dict:
    rows, corrs, sim_ms = [], [], []
    n_inst = 0
    t_start = time.perf_counter()
    for name, spec, snap in instances(args.small, args.medium, args.seed, args.spanning):
        try:
            options = plan(spec, snap)
        except CpnError:
            continue
        n_inst += 1
        for o in options:
            t0 = time.perf_counter()
            sim = simulate(spec, o, snap, **GOODPUT)
            sim_ms.append((time.perf_counter() - t0) * 1e3)
            rows.append((name, o, o.estimates.step_s, sim))
        # rank agreement over random placements of the first option's degrees
        rng = np.random.default_rng(args.seed + n_inst)
        o = options[0]
        pairs = [(iteration_s(o.estimates.step_s), rows[-len(options)][3].step_s)]
        for _ in range(args.shuffles):
            tasks = shuffled(o, snap, rng)
            if tasks is None:
                break
            try:
                est = estimate_option(
                    Placement(
                        spec,
                        snap,
                        tasks,
                        dp=o.dp,
                        tp=o.tp,
                        pp=o.pp,
                        zero=o.zero,
                        pp_schedule=o.pp_schedule,
                        spot=o.spot,
                    )
                )
                sim = simulate(spec, o.model_copy(update={"tasks": tasks}), snap, **GOODPUT)
            except CpnError:  # the planner refuses it (memory, mixed models, no link)
                continue
            pairs.append((iteration_s(est.step_s), sim.step_s))
        p, s = np.array(pairs).T
        if len(pairs) >= 3 and np.ptp(s) > 1e-9 * s.max():
            # an estimate that does not move while the reference does ranks nothing: correlation 0
            corrs.append(float(spearmanr(p, s).statistic) if np.ptp(p) > 1e-9 * p.max() else 0.0)
    return {
        "rows": rows,
        "corrs": corrs,
        "instances": n_inst,
        "sim_ms": sim_ms,
        "wall_s": time.perf_counter() - t_start,
    }


def crosses_regions(option: PlanOption) -> bool:
    """Whether a replica of the option has pipeline stages in two regions."""
    seen: dict[int, str] = {}
    return any(seen.setdefault(t.dp_rank, t.region) != t.region for t in option.tasks)


def report(res: dict) -> dict:
    rows = res["rows"]
    head = f"{'instance':<12} {'dp':>3} {'tp':>2} {'pp':>2} {'sync':<9}"
    print(f"{head} {'planner s':>10} {'sim s':>10} {'err':>7}")
    errs, with_ckpt, across = [], [], []
    for name, o, est, sim in rows:
        err = abs(iteration_s(est) - sim.step_s) / sim.step_s
        errs.append(err)
        if crosses_regions(o):
            across.append(err)
        with_ckpt.append(abs(est.total - sim.step_s) / sim.step_s)
        print(
            f"{name:<12} {o.dp:>3} {o.tp:>2} {o.pp:>2} {o.sync.mode:<9} {iteration_s(est):>10.4f} "
            f"{sim.step_s:>10.4f} {err:>7.1%}"
        )
    print("\nper term: median planner/sim where both > 0; summed |term error| / sim step")
    total_abs = {k: 0.0 for k in TERMS}
    for k, sk in TERMS.items():
        ratios = []
        for _, _, est, sim in rows:
            a, b = getattr(est, k), getattr(sim, sk)
            total_abs[k] += abs(a - b) / sim.step_s
            if a > 0 and b > 0:
                ratios.append(a / b)
        nz_p = sum(getattr(est, k) > 0 for _, _, est, _ in rows)
        nz_s = sum(getattr(sim, sk) > 0 for _, _, _, sim in rows)
        med = f"{np.median(ratios):8.2f}x" if ratios else "       -"
        print(f"  {k:<10} {med}  (planner > 0 in {nz_p}, sim > 0 in {nz_s} of {len(rows)})", end="")
        print(f"  rel err sum {total_abs[k]:.2f}")
    worst = max(total_abs, key=lambda k: total_abs[k])
    print(f"term with the largest summed relative error: {worst}")
    print(
        f"simulator: p50 {np.median(res['sim_ms']):.1f} ms, max {max(res['sim_ms']):.1f} ms per option; "
        f"rank correlation over {len(res['corrs'])} instances of shuffled placements; "
        f"wall {res['wall_s']:.0f} s"
    )
    return {
        "instances": res["instances"],
        "options": len(rows),
        "sim_estimate_err_p50": round(float(np.percentile(errs, 50)), 4),
        "sim_estimate_err_p90": round(float(np.percentile(errs, 90)), 4),
        "sim_estimate_err_p90_with_checkpoints": round(float(np.percentile(with_ckpt, 90)), 4),
        "rank_corr": round(float(np.mean(res["corrs"])), 3) if res["corrs"] else None,
        "largest_error_term": worst,
        "cross_region_options": len(across),
        "cross_region_err_p90": round(float(np.percentile(across, 90)), 4) if across else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=60)
    ap.add_argument("--medium", type=int, default=12)
    ap.add_argument("--spanning", type=int, default=20)
    ap.add_argument("--shuffles", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    print(json.dumps(report(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
