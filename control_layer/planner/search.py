"""Estimate-then-solve: candidates, bounds, placement (MILP or heuristic), Pareto front, options."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from control_layer.planner import cost_model as cm
from control_layer.planner.candidates import Degrees, enumerate_degrees
from control_layer.planner.fleet import filter_fleet
from control_layer.planner.heuristic import candidate_solutions
from control_layer.planner.milp import integer_vars, milp_solutions
from control_layer.planner.options import build_option
from control_layer.planner.pareto import labels, pareto_front, select
from control_layer.planner.plan_types import Calibration, PlanOption
from control_layer.planner.problem import (
    Problem,
    Score,
    Solution,
    build_fleet,
    build_problem,
    evaluate,
)
from control_layer.planner.screen import screen
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.spec import JobSpec
from orchestration.errors import NoFeasiblePlan

# A heuristic answer within this fraction of the candidate's lower bound is taken as optimal
# (so the MILP's exactness is only paid for where it can change the answer by more).
GAP_TOLERANCE = 0.002
# The other end of the front (the fastest option when the objective is cost, and the reverse) is
# searched to this tolerance.
OTHER_END_TOLERANCE = 0.05
# Candidates solved at most to fill the middle of the front when it has fewer than max_options.
FRONT_FILL = 8
# The MILP's budget, in integer variables (deterministic, unlike a clock): a model larger than
# MAX_INTEGER_VARS is left to the heuristic, and the models solved in one quote add up to at most
# MILP_WORK_BUDGET; beyond it the heuristic's answer stands.
MAX_INTEGER_VARS = 150
MILP_WORK_BUDGET = 400


@dataclass(frozen=True)
class Scored:
    score: Score
    problem: Problem
    solution: Solution

    @property
    def point(self) -> tuple[float, float]:
        return (self.score.duration_s, self.score.cost)

    def tiebreak(self) -> tuple:
        d = self.problem.deg
        return (d.tp * d.pp, d.zero, d.pp, d.tp, d.dp, self.solution.n1, self.solution.n2, self.solution.x2)


@dataclass
class _Trace:
    """What removed the candidates, for the explanation when nothing is left."""

    memory: list[tuple[Degrees, float, float]] = field(default_factory=list)  # deg, need GB, best GB
    capacity: list[tuple[Degrees, int]] = field(default_factory=list)  # deg, replicas possible
    lb_time_s: float = math.inf  # lower bounds over all viable candidates
    lb_cost: float = math.inf
    best_time_s: float = math.inf  # over all evaluated placements
    best_cost: float = math.inf
    cost_at_time_ok: float = math.inf  # cheapest among plans within max_hours
    time_at_cost_ok: float = math.inf  # fastest among plans within max_cost
    unlinked: int = 0

    def note(self, spec: JobSpec, sc: Score) -> None:
        self.best_time_s = min(self.best_time_s, sc.duration_s)
        self.best_cost = min(self.best_cost, sc.cost)
        q = spec.qos
        if q.max_hours is None or sc.duration_s <= q.max_hours * 3600.0:
            self.cost_at_time_ok = min(self.cost_at_time_ok, sc.cost)
        if q.max_cost is None or sc.cost <= q.max_cost:
            self.time_at_cost_ok = min(self.time_at_cost_ok, sc.duration_s)


def _interleaved(queue: list[tuple[tuple[float, float], Degrees]]):
    """Candidates cheapest bound and fastest bound first in turn."""
    by_cost = sorted(queue, key=lambda it: (it[0][1], it[0][0], it[1]))
    by_time = sorted(queue, key=lambda it: (it[0][0], it[0][1], it[1]))
    done: set[Degrees] = set()
    for a, b in zip(by_cost, by_time, strict=True):
        for item in (a, b):
            if item[1] not in done:
                done.add(item[1])
                yield item


def _within_qos(spec: JobSpec, s: Score) -> bool:
    q = spec.qos
    if q.max_hours is not None and s.duration_s > q.max_hours * 3600.0:
        return False
    return not (q.max_cost is not None and s.cost > q.max_cost)


def search(
    spec: JobSpec, snapshot: ResourceSnapshot, calibration: Calibration | None, max_options: int
) -> list[PlanOption]:
    filtered = filter_fleet(spec, snapshot)
    explanation: list[dict[str, Any]] = list(filtered.steps)
    if not filtered.pools:
        last = filtered.steps[-1]
        raise NoFeasiblePlan(
            f"no free devices left after {last['constraint']}"
            if len(filtered.steps) > 1
            else "no free devices",
            explanation=explanation,
        )
    fleet = build_fleet(spec, snapshot, filtered.pools, calibration)
    degrees, notes, too_big = enumerate_degrees(spec, fleet.n_devices, fleet.max_node_devices)
    explanation += [{"constraint": "parallelism", "detail": n} for n in notes]
    if too_big is not None:
        explanation.append(
            {
                "constraint": "capacity",
                "detail": _too_few(
                    fleet, too_big.n_devices, f"dp={too_big.dp}, tp={too_big.tp}, pp={too_big.pp}"
                ),
            }
        )
        raise NoFeasiblePlan(explanation[-1]["detail"], explanation=explanation)

    trace = _Trace()
    queue: list[tuple[tuple[float, float], Degrees]] = []
    screened, bounds = screen(fleet, degrees, spec.pinned.zero is not None)
    for sc in screened:
        if sc.status == "memory":
            trace.memory.append((sc.deg, sc.need_gb, sc.have_gb))
        elif sc.status == "capacity":
            trace.capacity.append((sc.deg, sc.capacity))
        elif sc.status == "ok":
            lb = sc.lb
            trace.lb_time_s = min(trace.lb_time_s, lb[0])
            trace.lb_cost = min(trace.lb_cost, lb[1])
            if spec.qos.max_hours is not None and lb[0] > spec.qos.max_hours * 3600.0:
                continue
            if spec.qos.max_cost is not None and lb[1] > spec.qos.max_cost:
                continue
            if math.isfinite(lb[0]):
                queue.append((lb, sc.deg))
    problems: dict[Degrees, Problem] = {}

    def problem(deg: Degrees) -> Problem:
        if deg not in problems:
            problems[deg] = build_problem(fleet, deg)
        return problems[deg]

    front: list[Scored] = []
    best_of: dict[Degrees, tuple[float, float]] = {}

    def consider(pr: Problem, sols) -> None:
        nonlocal front
        fresh: list[Scored] = []
        for sol in sols:
            sc = evaluate(pr, sol)
            if sc is None:
                trace.unlinked += 1
                continue
            trace.note(spec, sc)
            if _within_qos(spec, sc):
                fresh.append(Scored(sc, pr, sol))
                bt, bc = best_of.get(pr.deg, (math.inf, math.inf))
                best_of[pr.deg] = (min(bt, sc.duration_s), min(bc, sc.cost))
        if fresh:
            front = pareto_front(front + fresh, lambda s: s.point, Scored.tiebreak)

    axis = 0 if spec.qos.objective == "time" else 1

    def improves(lb: tuple[float, float]) -> bool:
        """Whether a candidate with this bound could improve the objective's best option by more
        than GAP_TOLERANCE, or the other end of the front by more than OTHER_END_TOLERANCE (the
        options between come from the candidates solved)."""
        if not front:
            return True
        slack = [1 + OTHER_END_TOLERANCE, 1 + OTHER_END_TOLERANCE]
        slack[axis] = 1 + GAP_TOLERANCE
        return lb[0] * slack[0] < front[0].point[0] or lb[1] * slack[1] < front[-1].point[1]

    def within_qos_bound(lb: tuple[float, float]) -> bool:
        q = spec.qos
        return (q.max_hours is None or lb[0] <= q.max_hours * 3600.0) and (
            q.max_cost is None or lb[1] <= q.max_cost
        )

    def promising(deg: Degrees, quick: tuple[float, float]) -> bool:
        """The quick bound first; the full one (a layout at a time) only if that did not rule it out."""
        if not improves(quick):
            return False
        full = bounds.full(deg)
        return within_qos_bound(full) and improves(full)

    # Heuristic first: cheap, and its front prunes most candidates before any MILP. Candidates
    # come cheapest-bound and fastest-bound first in turn, so both ends of the front tighten early.
    solved: set[Degrees] = set()
    for lb, deg in _interleaved(queue):
        if promising(deg, lb):
            pr = problem(deg)
            solved.add(deg)
            consider(pr, candidate_solutions(pr))
    # Fill in the middle of the front: candidates whose bound lies between the two ends and is
    # not dominated by a point already found, best balanced bound first, a few at most.
    filled = 0
    if front and len(front) < max_options:
        fastest, cheapest = front[0].point[0], front[-1].point[1]
        middle = sorted(
            (lb[0] / fastest + lb[1] / cheapest, deg, lb) for lb, deg in queue if deg not in solved
        )
        for _, deg, quick in middle:
            if filled >= FRONT_FILL or len(front) >= max_options:
                break
            if any(f.point[0] <= quick[0] and f.point[1] <= quick[1] for f in front):
                continue
            lb = bounds.full(deg)
            if not within_qos_bound(lb) or any(f.point[0] <= lb[0] and f.point[1] <= lb[1] for f in front):
                continue
            filled += 1
            pr = problem(deg)
            consider(pr, candidate_solutions(pr))
    # Then the exact MILP for the objective, on candidates (best bound first) that could still
    # beat the best option by more than the tolerance; each solve is told the value to beat.
    work = 0
    for lb, deg in sorted(queue, key=lambda item: (item[0][axis], item[0][1 - axis], item[1])):
        best = min((f.point[axis] for f in front), default=math.inf)
        if lb[axis] * (1 + GAP_TOLERANCE) >= best:
            break
        lb = bounds.full(deg)
        if lb[axis] * (1 + GAP_TOLERANCE) >= best or not within_qos_bound(lb):
            continue
        own = best_of.get(deg, (math.inf, math.inf))[axis]
        if own <= lb[axis] * (1 + GAP_TOLERANCE):
            continue
        pr = problem(deg)
        size = integer_vars(pr, spec.qos.objective)
        if size > MAX_INTEGER_VARS:
            continue
        if work + size > MILP_WORK_BUDGET:
            break
        work += size
        consider(pr, milp_solutions(pr, spec.qos.objective, beat=best))

    if not front:
        explanation += _explain(spec, fleet, trace)
        raise NoFeasiblePlan(explanation[-1]["detail"], explanation=explanation)

    point = lambda s: s.point  # noqa: E731
    named = labels(front, point)
    best = 0 if spec.qos.objective == "time" else len(front) - 1
    picked = select(len(front), named, max_options, best)
    out = []
    for i in picked:
        option = build_option(front[i].problem, front[i].solution)
        if all(c.ok for c in option.qos_checks):
            out.append(option.model_copy(update={"label": named.get(i)}))
    if spec.qos.objective == "time":
        out.sort(key=lambda o: (o.estimates.duration_s, o.estimates.cost.total, o.id))
    else:
        out.sort(key=lambda o: (o.estimates.cost.total, o.estimates.duration_s, o.id))
    return out


def _memory_gap(pr: Problem) -> tuple[float, float]:
    """Per-device need with the widest ZeRO sharding the fleet allows, and the largest device."""
    spec, deg = pr.fleet.spec, pr.deg
    most = max(1, int(pr.cap.max()) if len(pr.cap) else 1)
    need = cm.memory_per_device(spec, deg.tp, deg.pp, deg.zero, most, pr.n_micro, spec.pp_schedule).total
    return need / cm.GB, float(pr.fleet.cls_memory.max()) * cm.USABLE_MEMORY_FRACTION


def _too_few(fleet, need: int, shape: str) -> str:
    mem = float(fleet.cls_memory.min())
    if len(fleet.regions) == 1:
        return f"no region in {fleet.regions} has {need} free devices with ≥ {mem:g} GB ({shape})"
    return (
        f"the regions {fleet.regions} have {fleet.n_devices} free devices with ≥ {mem:g} GB in all; "
        f"the smallest layout that fits the model ({shape}) needs {need}"
    )


def _explain(spec: JobSpec, fleet, trace: _Trace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    viable = math.isfinite(trace.lb_time_s)
    if trace.memory and not viable and not trace.capacity:
        deg, need, have = min(trace.memory, key=lambda m: m[1])
        out.append(
            {
                "constraint": "memory",
                "removed_candidates": len(trace.memory),
                "detail": (
                    f"no parallel layout fits in memory: the leanest (dp={deg.dp}, tp={deg.tp}, pp={deg.pp}, "
                    f"zero={deg.zero}) needs {need:.1f} GB per device; the largest allowed device has "
                    f"{have:.1f} GB usable"
                ),
            }
        )
        return out
    if trace.memory:
        out.append(
            {
                "constraint": "memory",
                "removed_candidates": len(trace.memory),
                "detail": f"{len(trace.memory)} parallel layouts do not fit in device memory",
            }
        )
    if trace.capacity and not viable:
        deg, have = min(trace.capacity, key=lambda c: (c[0].n_devices, c[0]))
        shape = f"dp={deg.dp}, tp={deg.tp}, pp={deg.pp}, in groups of {deg.devices_per_replica}"
        out.append(
            {
                "constraint": "capacity",
                "removed_candidates": len(trace.capacity),
                "detail": _too_few(fleet, deg.n_devices, shape)
                + f"; at most {have} of {deg.dp} replicas fit",
            }
        )
        return out
    q = spec.qos
    evaluated = math.isfinite(trace.best_time_s)
    fastest = trace.best_time_s if evaluated else trace.lb_time_s
    cheapest = trace.best_cost if evaluated else trace.lb_cost
    at_least = "" if evaluated else "at least "
    if q.max_hours is not None and fastest > q.max_hours * 3600.0:
        out.append(
            {
                "constraint": "qos.max_hours",
                "value": q.max_hours,
                "detail": (
                    f"the fastest plan takes {at_least}{fastest / 3600.0:.2f} h > max_hours {q.max_hours:g}"
                ),
            }
        )
    if q.max_cost is not None and cheapest > q.max_cost:
        out.append(
            {
                "constraint": "qos.max_cost",
                "value": q.max_cost,
                "detail": f"the cheapest plan costs {at_least}${cheapest:,.2f} > max_cost ${q.max_cost:,.2f}",
            }
        )
    if not out and q.max_hours is not None and q.max_cost is not None and evaluated:
        out.append(
            {
                "constraint": "qos.max_hours+qos.max_cost",
                "detail": (
                    f"plans within {q.max_hours:g} h cost at least ${trace.cost_at_time_ok:,.2f}; "
                    f"plans within ${q.max_cost:,.2f} take at least {trace.time_at_cost_ok / 3600.0:.2f} h"
                ),
            }
        )
    if not out:
        out.append(
            {
                "constraint": "links",
                "detail": "no placement connects its regions: a needed inter-region link is missing",
            }
        )
    return out
