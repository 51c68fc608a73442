"""Estimate-then-solve: candidates, bounds, placement (heuristic, then MILP), Pareto front, options.

1. Filter the fleet by the QoS constraints and group identical clusters into classes.
2. Enumerate the (dp, tp, pp, zero) candidates and screen them all at once: memory, capacity and
   a quick lower bound on (duration, cost); the full bound is computed lazily.
3. Solve candidates with the vectorised heuristic, bound first, skipping those whose bound cannot
   improve the fastest or cheapest option found; fill the middle of the front with a few more.
4. Run the exact MILP on the candidates that could still beat the objective's best option, within
   a deterministic budget.
5. Label the front (cheapest, fastest, balanced), build up to max_options complete options.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contracts.errors import NoFeasiblePlan
from contracts.feasibility import resolve_precision
from contracts.job_spec import JobSpec
from control_layer.planner.candidates import Degrees, enumerate_degrees
from control_layer.planner.cross_cluster import public_crossings
from control_layer.planner.explain import Trace, explain, too_few
from control_layer.planner.fleet import Pool, filter_fleet
from control_layer.planner.heuristic import candidate_solutions
from control_layer.planner.milp import integer_vars, milp_solutions
from control_layer.planner.options import build_option, qos_checks
from control_layer.planner.pareto import labels, pareto_front, select
from control_layer.planner.plan_types import Calibration, PlanOption
from control_layer.planner.problem import (
    Fleet,
    Problem,
    Score,
    Solution,
    build_fleet,
    build_problem,
    evaluate_many,
)
from control_layer.planner.queue_wait import price_queue_wait, queued, without_queues_past_bound
from control_layer.planner.residency import cover, needed_indices, resident_check
from control_layer.planner.screen import Bounds, screen
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.spanning import spanning_competes, spanning_options
from control_layer.planner.staging import DataStaging, price_staging
from control_layer.planner.sync_choice import AutoSync, provisional

# A heuristic answer within this fraction of the candidate's lower bound is taken as optimal,
# and a candidate that cannot beat the objective's best option by more is not solved.
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

Bound = tuple[float, float]  # (duration s, cost USD)
_Entry = tuple[float, float, Degrees, bool]  # a side's bound, the other's, candidate, is it the full one


@dataclass(frozen=True)
class Scored:
    score: Score
    problem: Problem
    solution: Solution

    @property
    def point(self) -> Bound:
        return (self.score.duration_s, self.score.cost)

    def tiebreak(self) -> tuple:
        d = self.problem.deg
        return (d.tp * d.pp, d.zero, d.pp, d.tp, d.dp, self.solution.n1, self.solution.n2, self.solution.x2)


class _Search:
    def __init__(self, spec: JobSpec, fleet: Fleet, bounds: Bounds, trace: Trace, auto: AutoSync) -> None:
        self.spec = spec
        self.auto = auto
        self.fleet = fleet
        self.bounds = bounds
        self.trace = trace
        self.axis = 0 if spec.qos.objective == "time" else 1
        self.front: list[Scored] = []
        self.best_of: dict[Degrees, Bound] = {}  # per candidate, the best (duration, cost) found
        self.quick: dict[Degrees, Bound] = {}  # per queued candidate, its quick bound
        self._problems: dict[Degrees, Problem] = {}
        # Resident shards' regions (indices in the fleet's regions): each solution gets a replica
        # in every one (``residency.cover``) before it is scored.
        self.needed = needed_indices(spec, fleet.regions) if spec.data.shards else ()

    # ------------------------------------------------------------------ bookkeeping

    def problem(self, deg: Degrees) -> Problem:
        if deg not in self._problems:
            self._problems[deg] = build_problem(self.fleet, deg)
        return self._problems[deg]

    def within_qos(self, point: Bound) -> bool:
        q = self.spec.qos
        if q.max_hours is not None and point[0] > q.max_hours * 3600.0:
            return False
        return q.max_cost is None or point[1] <= q.max_cost

    def consider(self, pr: Problem, solutions: Iterable[Solution]) -> None:
        """Score solutions exactly; those within the QoS bounds join the front."""
        fresh: list[Scored] = []
        sols = list(solutions)
        if self.needed:
            sols = [c for c in (cover(pr, s, self.needed) for s in sols) if c is not None]
        for sol, sc in zip(sols, evaluate_many(pr, sols), strict=True):
            if sc is None:
                continue
            self.trace.note(self.spec, sc)
            if self.within_qos((sc.duration_s, sc.cost)):
                fresh.append(Scored(sc, pr, sol))
                bt, bc = self.best_of.get(pr.deg, (math.inf, math.inf))
                self.best_of[pr.deg] = (min(bt, sc.duration_s), min(bc, sc.cost))
        if fresh:
            self.front = pareto_front(self.front + fresh, lambda s: s.point, Scored.tiebreak)

    def improves(self, lb: Bound) -> bool:
        """Whether a candidate with this bound could improve the objective's best option by more
        than GAP_TOLERANCE, or the other end of the front by more than OTHER_END_TOLERANCE (the
        options between come from the candidates solved)."""
        if not self.front:
            return True
        slack = [1 + OTHER_END_TOLERANCE, 1 + OTHER_END_TOLERANCE]
        slack[self.axis] = 1 + GAP_TOLERANCE
        return lb[0] * slack[0] < self.front[0].point[0] or lb[1] * slack[1] < self.front[-1].point[1]

    def dominated(self, lb: Bound) -> bool:
        return any(f.point[0] <= lb[0] and f.point[1] <= lb[1] for f in self.front)

    # ------------------------------------------------------------------ the three passes

    def heuristic_pass(self, queue: list[tuple[Bound, Degrees]]) -> set[Degrees]:
        """The cheapest and the fastest side in turn, each from a heap of quick bounds. The
        objective's side is best bound first (branch and bound): a candidate reaching its top
        goes back at its full bound and is solved when that tops the heap and could still improve
        the front, so where the bounds are tight the best option is found first and rules out the
        rest, whatever order the quick bounds (which leave out the exchange) would give. The other
        side solves in quick-bound order (best-first there solved more candidates)."""
        solved: set[Degrees] = set()
        done: set[Degrees] = set()
        sides = []
        for axis in (1, 0):  # the cheapest side first
            heap = [(lb[axis], lb[1 - axis], deg, False) for lb, deg in queue]
            heapq.heapify(heap)
            sides.append((axis, heap))
        while any(heap for _, heap in sides):
            for axis, heap in sides:
                deg = self._next(axis, heap, done)
                if deg is not None:
                    solved.add(deg)
                    pr = self.problem(deg)
                    self.consider(pr, candidate_solutions(pr))
        return solved

    def _next(self, axis: int, heap: list[_Entry], done: set[Degrees]) -> Degrees | None:
        """The side's next candidate to solve (None when none is left): candidates that cannot
        improve the front are dropped for good (the front only gets better)."""
        while heap:
            _, _, deg, refined = heapq.heappop(heap)
            if deg in done:
                continue
            if not refined:
                if not self.improves(self.quick[deg]):
                    done.add(deg)
                    continue
                # Computed with deg's: the bounds of the candidates whose quick bound passes too.
                full = self.bounds.full(deg, lambda d: self.improves(self.quick[d]))
                if not (self.within_qos(full) and self.improves(full)):
                    done.add(deg)
                    continue
                if axis == self.axis:
                    heapq.heappush(heap, (full[axis], full[1 - axis], deg, True))
                    continue
            elif not self.improves(self.bounds.full(deg)):
                done.add(deg)
                continue
            done.add(deg)
            return deg
        return None

    def fill_front(self, queue: list[tuple[Bound, Degrees]], solved: set[Degrees], want: int) -> None:
        """Candidates whose bound lies between the two ends and is not dominated by a point already
        found, best balanced bound first, a few at most."""
        if not self.front or len(self.front) >= want:
            return
        fastest, cheapest = self.front[0].point[0], self.front[-1].point[1]
        middle = sorted(
            (lb[0] / fastest + lb[1] / cheapest, deg, lb) for lb, deg in queue if deg not in solved
        )
        filled = 0
        for _, deg, quick in middle:
            if filled >= FRONT_FILL or len(self.front) >= want:
                break
            if self.dominated(quick):
                continue
            full = self.bounds.full(deg, lambda d: d not in solved and not self.dominated(self.quick[d]))
            if not self.within_qos(full) or self.dominated(full):
                continue
            filled += 1
            pr = self.problem(deg)
            self.consider(pr, candidate_solutions(pr))

    def milp_pass(self, queue: list[tuple[Bound, Degrees]]) -> None:
        """The exact MILP for the objective, best bound first, on candidates that could still beat
        the best option by more than the tolerance; each solve is told the value to beat."""
        axis, objective = self.axis, self.spec.qos.objective
        work = 0
        for quick, deg in sorted(queue, key=lambda it: (it[0][axis], it[0][1 - axis], it[1])):
            best = min((f.point[axis] for f in self.front), default=math.inf)
            if quick[axis] * (1 + GAP_TOLERANCE) >= best:
                break
            lb = self.bounds.full(deg, lambda d: self.quick[d][axis] * (1 + GAP_TOLERANCE) < best)  # noqa: B023
            if lb[axis] * (1 + GAP_TOLERANCE) >= best or not self.within_qos(lb):
                continue
            if self.best_of.get(deg, (math.inf, math.inf))[axis] <= lb[axis] * (1 + GAP_TOLERANCE):
                continue  # the heuristic already reached the bound
            pr = self.problem(deg)
            size = integer_vars(pr, objective, above=MAX_INTEGER_VARS)
            if size > MAX_INTEGER_VARS:
                continue
            if work + size > MILP_WORK_BUDGET:
                break
            work += size
            self.consider(pr, milp_solutions(pr, objective, beat=best))

    def options(self, max_options: int) -> list[PlanOption]:
        """Build the chosen points of the front as options (re-priced on their tasks)."""
        named = labels(self.front, lambda s: s.point)
        best = 0 if self.axis == 0 else len(self.front) - 1
        built = [
            build_option(self.front[i].problem, self.front[i].solution, self.auto)
            for i in select(len(self.front), named, max_options, best)
        ]
        return [o for o in built if all(c.ok for c in o.qos_checks)]


def finish(options: list[PlanOption], objective: str, max_options: int) -> list[PlanOption]:
    """Filter options to their own front (a re-priced point can move), label and order them."""
    axis = 0 if objective == "time" else 1
    point = lambda o: (o.estimates.duration_s, o.estimates.cost.total)  # noqa: E731
    final = pareto_front(options, point, lambda o: (o.tp * o.pp, o.zero, o.id))
    if len(final) > max_options:
        named = labels(final, point)
        final = [final[i] for i in select(len(final), named, max_options, 0 if axis == 0 else len(final) - 1)]
    names = labels(final, point)
    if len(final) == 1:  # one option is both ends; name it for the objective
        names = {0: "fastest" if axis == 0 else "cheapest"}
    out = [o.model_copy(update={"label": names.get(i)}) for i, o in enumerate(final)]
    if axis == 0:
        out.sort(key=lambda o: (o.estimates.duration_s, o.estimates.cost.total, o.id))
    else:
        out.sort(key=lambda o: (o.estimates.cost.total, o.estimates.duration_s, o.id))
    return out


def with_precision(spec: JobSpec, precision: str) -> JobSpec:
    """The spec with its precision resolved: the cost model prices one precision."""
    if spec.training.precision == precision:
        return spec
    return spec.model_copy(update={"training": spec.training.model_copy(update={"precision": precision})})


def precision_groups(spec: JobSpec, pools: list[Pool]) -> list[tuple[str, list[Pool]]]:
    """The pools each precision is planned on. 'auto' resolves per option, bf16 only when every
    device is CUDA: CUDA pools are planned at bf16 and CPU pools at fp32 (an option never mixes
    the two kinds under 'auto'); a pinned precision plans every pool at it."""
    requested = spec.training.precision
    if requested != "auto":
        return [(requested, pools)]
    groups = []
    for kinds in (("cuda",), ("cpu",)):
        mine = [p for p in pools if p.kind in kinds]
        if mine:
            groups.append((resolve_precision("auto", kinds), mine))
    return groups


def search(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    calibration: Calibration | None,
    max_options: int,
    staging: DataStaging | None = None,
) -> list[PlanOption]:
    # Sync settings left to the planner: the codec now, H per option (``sync_choice``); the
    # search ranks placements at the provisional H, and each option is priced at its own.
    spec, auto = provisional(spec)
    snapshot = without_queues_past_bound(spec, snapshot, calibration)
    filtered = filter_fleet(spec, snapshot)
    explanation: list[dict[str, Any]] = list(filtered.steps)
    if not filtered.pools:
        last = filtered.steps[-1]
        message = (
            f"no free devices left after {last['constraint']}"
            if len(filtered.steps) > 1
            else "no free devices"
        )
        raise NoFeasiblePlan(message, explanation=explanation)
    if spec.data.shards:
        left = {p.region for p in filtered.pools}
        lacking = [r for r in spec.data.resident_regions if r not in left]
        if lacking:
            detail = (
                f"resident shards live in {lacking}, which have no free devices left after the"
                " constraints above; a resident shard is read only in its region"
            )
            explanation.append({"constraint": "data.shards", "value": lacking, "detail": detail})
            raise NoFeasiblePlan(detail, explanation=explanation)
    options: list[PlanOption] = []
    failures: list[NoFeasiblePlan] = []
    for precision, pools in precision_groups(spec, filtered.pools):
        try:
            options += _search_pools(
                with_precision(spec, precision), snapshot, pools, calibration, max_options, explanation, auto
            )
        except NoFeasiblePlan as exc:
            failures.append(exc)
    competing = bool(options)
    if not competing or spanning_competes(filtered.pools, snapshot):
        # Replicas across nodes (priced at the provisional H, which their workers then run:
        # ``sync_choice.pinned``): where nothing has every replica on one node, and wherever
        # nodes of two clusters or more may share a replica (a pipeline across clusters or
        # regions) or nodes sit behind their own slower ports (replicas on one node would meet
        # over them), there weighed on the front with the search's own options.
        for precision, pools in precision_groups(spec, filtered.pools):
            options += spanning_options(
                with_precision(spec, precision), snapshot, pools, calibration, competing=competing
            )
    if spec.data.shards or staging is not None or queued(snapshot, calibration):
        options = _with_data(options, spec, snapshot, calibration, staging)
    if not options:
        if failures:
            raise _with_public_crossings(failures[0], snapshot, {p.region for p in filtered.pools})
        # Every point of the front failed a QoS check once priced on its tasks with its own
        # runtime settings (an H chosen per option can move its egress and time).
        detail = "no option met the QoS bounds once priced with its runtime settings"
        raise NoFeasiblePlan(detail, explanation=[*explanation, {"constraint": "qos", "detail": detail}])
    return finish(options, spec.qos.objective, max_options)


def _with_public_crossings(
    exc: NoFeasiblePlan, snapshot: ResourceSnapshot, regions: set[str]
) -> NoFeasiblePlan:
    """``exc``, saying too where replicas across clusters were not planned because a link between
    them is not declared private (``cross_cluster.public_crossings``)."""
    public = public_crossings(snapshot, regions)
    if not public:
        return exc
    pairs = ", ".join(f"{a}<->{b}" if a != b else f"{a} (between its clusters)" for a, b in public)
    detail = (
        f"no torchrun group spans clusters over a link not declared private ({pairs}): its gloo/NCCL"
        " traffic is plaintext (PUT /v1/links with private: true)"
    )
    explanation = [
        *exc.details.get("explanation", []),
        {"constraint": "links.private", "value": public, "detail": detail},
    ]
    return NoFeasiblePlan(f"{exc.message}; {detail}", **(exc.details | {"explanation": explanation}))


def _with_data(
    options: list[PlanOption],
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    calibration: Calibration | None,
    staging: DataStaging | None,
) -> list[PlanOption]:
    """Options priced with their staging and queue wait, checked again on their QoS bounds
    (staging adds time and cost, a queue time) and on the resident shards' regions; those that
    fail any check are dropped."""
    out = []
    for o in options:
        if staging is not None:
            o = price_staging(o, spec, snapshot, staging, calibration)
        o = price_queue_wait(o, snapshot, calibration)
        checks = qos_checks(spec, snapshot, o.tasks, o.estimates, o.spot)
        resident = resident_check(spec, o.regions)
        if resident is not None:
            checks.append(resident)
        if all(c.ok for c in checks):
            out.append(o.model_copy(update={"qos_checks": checks}))
    return out


def _search_pools(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    pools: list[Pool],
    calibration: Calibration | None,
    max_options: int,
    explanation: list[dict[str, Any]],
    auto: AutoSync,
) -> list[PlanOption]:
    explanation = list(explanation)
    if spec.training.precision != "auto":
        explanation.append({"constraint": "precision", "detail": f"planned at {spec.training.precision}"})
    fleet = build_fleet(spec, snapshot, pools, calibration)
    degrees, notes, too_big = enumerate_degrees(spec, fleet.n_devices, fleet.max_node_devices)
    explanation += [{"constraint": "parallelism", "detail": n} for n in notes]
    if too_big is not None:
        shape = f"dp={too_big.dp}, tp={too_big.tp}, pp={too_big.pp}"
        explanation.append({"constraint": "capacity", "detail": too_few(fleet, too_big.n_devices, shape)})
        raise NoFeasiblePlan(explanation[-1]["detail"], explanation=explanation)

    trace = Trace()
    queue: list[tuple[Bound, Degrees]] = []
    verdicts, bounds = screen(fleet, degrees, spec.pinned.zero is not None)
    run = _Search(spec, fleet, bounds, trace, auto)
    for v in verdicts:
        if v.status == "memory":
            trace.memory.append((v.deg, v.need_gb, v.have_gb))
        elif v.status == "capacity":
            trace.capacity.append((v.deg, v.capacity))
        elif v.status == "ok":
            trace.lb_time_s = min(trace.lb_time_s, v.lb[0])
            trace.lb_cost = min(trace.lb_cost, v.lb[1])
            if run.within_qos(v.lb) and math.isfinite(v.lb[0]):
                queue.append((v.lb, v.deg))

    bounds.ask_only({deg for _, deg in queue})  # full bounds are asked of queued candidates only
    run.quick = {deg: lb for lb, deg in queue}
    solved = run.heuristic_pass(queue)
    run.fill_front(queue, solved, max_options)
    run.milp_pass(queue)
    if not run.front:
        explanation += explain(spec, fleet, trace)
        raise NoFeasiblePlan(explanation[-1]["detail"], explanation=explanation)
    return run.options(max_options)
