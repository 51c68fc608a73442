"""Exhaustive reference planner for small instances: every degree, every placement.

Used to measure the search's optimality gap (tests and the benchmark); exponential, so only for
a handful of clusters.
"""

from __future__ import annotations

from collections.abc import Iterator

from contracts.job_spec import JobSpec
from control_layer.planner.candidates import Degrees, enumerate_degrees
from control_layer.planner.fleet import filter_fleet
from control_layer.planner.options import build_option
from control_layer.planner.plan_types import Calibration, PlanOption
from control_layer.planner.problem import Fleet, Problem, Solution, build_fleet, build_problem, evaluate
from control_layer.planner.search import precision_groups, with_precision
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.sync_choice import provisional


def _unit_choices(pr: Problem, u: int) -> list[tuple[int, int, int]]:
    if not pr.usable[u]:
        return [(0, 0, 0)]
    count, cap, lo = int(pr.count[u]), int(pr.cap[u]), int(pr.lo[u])
    out = []
    for n1 in range(count + 1 if lo <= 1 else 1):
        for n2 in range(count - n1 + 1 if cap >= 2 else 1):
            for x2 in range(n2 * max(2, lo), n2 * cap + 1) if n2 else [0]:
                out.append((n1, n2, x2))
    return out


def all_solutions(pr: Problem) -> Iterator[Solution]:
    """Every placement of dp replicas on the problem's units."""
    choices = [_unit_choices(pr, u) for u in range(pr.n_units)]

    def rec(u: int, left: int, acc: list[tuple[int, int, int]]) -> Iterator[Solution]:
        if u == len(choices):
            if left == 0:
                yield Solution(tuple(a[0] for a in acc), tuple(a[1] for a in acc), tuple(a[2] for a in acc))
            return
        for ch in choices[u]:
            take = ch[0] + ch[2]
            if take <= left:
                yield from rec(u + 1, left - take, [*acc, ch])

    yield from rec(0, pr.deg.dp, [])


def objective_key(spec: JobSpec, o: PlanOption) -> tuple[float, float]:
    e = o.estimates
    return (e.duration_s, e.cost.total) if spec.qos.objective == "time" else (e.cost.total, e.duration_s)


def exhaustive_best(
    spec: JobSpec, snapshot: ResourceSnapshot, calibration: Calibration | None = None, refine: int = 4
) -> PlanOption | None:
    """The best option for spec.qos.objective over every degree and every placement, or None.

    Placements are ranked by the search's objective (runtime settings included); the best few are
    then priced by the estimator on their concrete tasks, which is what options report.
    """
    spec, auto = provisional(spec)
    filtered = filter_fleet(spec, snapshot)
    if not filtered.pools:
        return None
    scored = []
    for precision, pools in precision_groups(spec, filtered.pools):
        fleet = build_fleet(with_precision(spec, precision), snapshot, pools, calibration)
        degrees, _, _ = enumerate_degrees(spec, fleet.n_devices, fleet.max_node_devices)
        scored += _scored(fleet, degrees)
    if not scored:
        return None
    scored.sort(key=lambda s: (s[0], s[1]))
    built = [build_option(pr, sol, auto) for _, _, sol, pr in scored[:refine]]
    options = [o for o in built if all(c.ok for c in o.qos_checks)] or built
    return min(options, key=lambda o: objective_key(spec, o))


def _scored(fleet: Fleet, degrees: list[Degrees]) -> list[tuple]:
    q = fleet.spec.qos
    scored = []
    for deg in degrees:
        pr = build_problem(fleet, deg)
        for sol in all_solutions(pr):
            sc = evaluate(pr, sol)
            if sc is None:
                continue
            if q.max_hours is not None and sc.duration_s > q.max_hours * 3600.0:
                continue
            if q.max_cost is not None and sc.cost > q.max_cost:
                continue
            key = (sc.duration_s, sc.cost) if q.objective == "time" else (sc.cost, sc.duration_s)
            scored.append((key, pr.deg, sol, pr))
    return scored
