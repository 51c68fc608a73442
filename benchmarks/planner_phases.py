"""Where a quote's planning time goes: CPU milliseconds per phase of the search, per quote.

    python benchmarks/planner_phases.py [--clusters 1000] [--quotes 20] [--seed 1] [--top 4] [--declared]

Plans the job sequence of ``planner.py`` on one generated fleet (prepared as the server prepares
its in-memory snapshot), once to warm what a server keeps across quotes, then again timing each
phase: fleet filter and build, the candidate screen, full lower bounds, problem building, the
heuristic fills, exact scoring, the MILP, building options, and spanning options. Also counts
the candidates each pass solved (heuristic, front fill, MILP). ``--declared``: every node of the
fleet declared its group endpoint reachable from other clusters (``--cross-cluster-host``), so
spanning options across clusters and regions are priced beside the search's on every quote.
Process CPU time, so other load on the machine inflates the figures less than wall time; shares
are what to compare. Prints a line per quote, the shares over the ``--top`` slowest quotes (the
ones a p95 is made of), and a JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import MODELS, fleet, job, private_links  # noqa: E402

import control_layer.planner.search as search  # noqa: E402
from contracts.errors import NoFeasiblePlan  # noqa: E402
from control_layer.heap import settle_long_lived  # noqa: E402
from control_layer.planner import plan, prepare  # noqa: E402
from control_layer.planner.screen import Bounds  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402

# Phase -> (owner, attribute): the search module's names for the functions it calls.
PHASES = {
    "filter": (search, "filter_fleet"),
    "fleet": (search, "build_fleet"),
    "screen": (search, "screen"),
    "bounds": (Bounds, "full"),
    "problem": (search, "build_problem"),
    "fills": (search, "candidate_solutions"),
    "scoring": (search, "evaluate_many"),
    "milp": (search, "milp_solutions"),
    "options": (search, "build_option"),
    "spanning": (search, "spanning_options"),
}
PASSES = {"heuristic": "heuristic_pass", "front_fill": "fill_front", "milp": "milp_pass"}


class Meter:
    """CPU seconds per phase (outermost timed call only) and solves per pass, for one quote."""

    def __init__(self) -> None:
        self.cpu: Counter[str] = Counter()
        self.solves: Counter[str] = Counter()
        self.depth = 0
        self.current_pass = ""

    def timed(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if name in ("fills", "milp"):
                self.solves[self.current_pass if name == "fills" else "milp"] += 1
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[name] += time.process_time() - t0
                self.depth -= 1

        return wrapper

    def within(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.current_pass = name
            try:
                return fn(*args, **kwargs)
            finally:
                self.current_pass = ""

        return wrapper

    @contextlib.contextmanager
    def installed(self):
        """The search's functions wrapped for the duration, then put back."""
        saved = [(owner, attr, getattr(owner, attr)) for owner, attr in PHASES.values()]
        saved += [(search._Search, attr, getattr(search._Search, attr)) for attr in PASSES.values()]
        try:
            for name, (owner, attr) in PHASES.items():
                setattr(owner, attr, self.timed(name, getattr(owner, attr)))
            for name, attr in PASSES.items():
                setattr(search._Search, attr, self.within(name, getattr(search._Search, attr)))
            yield self
        finally:
            for owner, attr, fn in saved:
                setattr(owner, attr, fn)


def declared(snap: ResourceSnapshot) -> ResourceSnapshot:
    """The fleet with every node's group endpoint declared reachable from other clusters, over
    links all declared private."""
    data = snap.model_dump()
    for c in data["clusters"]:
        for n in c["nodes"]:
            n["cross_cluster_groups"] = True
    return private_links(ResourceSnapshot.model_validate(data))


def measure(clusters: int, quotes: int, seed: int, all_declared: bool = False) -> list[dict]:
    """One row per quote: its CPU milliseconds, per phase (``other``: what no phase holds) and
    the candidates each pass solved."""
    snap = fleet(clusters, seed=seed)
    if all_declared:
        snap = declared(snap)
    prepare(snap)
    rng = np.random.default_rng(seed)
    specs = [job(i % len(MODELS), rng) for i in range(quotes)]
    for spec in specs:  # what a server keeps across quotes on one snapshot, warmed once
        with contextlib.suppress(NoFeasiblePlan):
            plan(spec, snap)
    settle_long_lived()
    rows = []
    with Meter().installed() as meter:
        for i, spec in enumerate(specs):
            meter.cpu.clear()
            meter.solves.clear()
            t0 = time.process_time()
            try:
                n_options = len(plan(spec, snap))
            except NoFeasiblePlan:
                n_options = 0
            total = (time.process_time() - t0) * 1000.0
            phases = {k: round(v * 1000.0, 1) for k, v in meter.cpu.items()}
            phases["other"] = round(total - sum(meter.cpu.values()) * 1000.0, 1)
            rows.append(
                {
                    "quote": i,
                    "model": spec.name,
                    "objective": spec.qos.objective,
                    "sync": spec.sync.mode,
                    "options": n_options,
                    "cpu_ms": round(total, 1),
                    "solved": dict(meter.solves),
                    "phases_ms": phases,
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--quotes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--top", type=int, default=4, help="slowest quotes summed for the shares")
    ap.add_argument("--declared", action="store_true", help="every node declared reachable across clusters")
    args = ap.parse_args()
    rows = measure(args.clusters, args.quotes, args.seed, args.declared)
    for r in rows:
        by_size = sorted(r["phases_ms"].items(), key=lambda kv: -kv[1])
        shown = "  ".join(f"{k} {v:.0f}" for k, v in by_size if v >= 0.5)
        print(
            f"{r['quote']:>3} {r['model']:<9} {r['objective']:<4} {r['sync']:<9} {r['cpu_ms']:7.1f} ms  "
            f"solved {r['solved']}  {shown}"
        )
    slow = sorted(rows, key=lambda r: -r["cpu_ms"])[: args.top]
    total = sum(r["cpu_ms"] for r in slow)
    shares: Counter[str] = Counter()
    for r in slow:
        shares.update(r["phases_ms"])
    share = {k: round(v / total, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}
    parts = ", ".join(f"{k} {v:.1%}" for k, v in share.items())
    print(f"slowest {len(slow)} quotes {[r['quote'] for r in slow]}: {parts}")
    cpu = [r["cpu_ms"] for r in rows]
    print(
        json.dumps(
            {
                "clusters": args.clusters,
                "declared": args.declared,
                "p50_cpu_ms": round(float(np.percentile(cpu, 50)), 1),
                "p95_cpu_ms": round(float(np.percentile(cpu, 95)), 1),
                "slowest": [r["quote"] for r in slow],
                "slowest_shares": share,
                "quotes": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
