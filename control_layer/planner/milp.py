"""Exact placement of one candidate as a MILP (scipy.optimize.milp, HiGHS). Its variables keep the
symbols docs/cost-model.md defines ("Search", "The MILP's variables").

Variables per unit u: v1, v2 (binary: some member hosts exactly one / two or more replicas),
y1, y2 (how many members), x2 (replicas on the y2 members). Per region: z (used). The exchange is
the runtime's flat ring over P participants, one per node: a one-hot pi_P picks P = Σ (y1 + y2),
so the terms that depend on P stay linear: products pi_P·(1/bandwidth), pi_P·latency and
pi_P·(egress price) are linearised exactly (a binary times a bounded continuous variable). The
slowest hop and largest latency come from the hop kinds present: a unit's cluster fabric when
two or more of its nodes share its first cluster, or two used units share it, a region's local
link when its nodes span clusters (two units of different first clusters, or more nodes than a
unit's first cluster has), and the links between used regions, as
``problem.sync_seconds_and_egress`` takes them.

Time objective: minimise theta, the step time (a tiny weight on the device rate breaks ties
toward the cheaper plan). Cost objective: theta × rate is bilinear, so each unit's replica count
is written in binary, x = Σ 2^j b_j, and theta·b_j is linearised exactly the same way; the cost
is then linear and the optimum is exact for the cost model.

Budgets are deterministic (a node limit here, an integer-variable budget in search.py, so the same
input gives the same answer); a wall-clock limit exists only as a safety net. Each solve is told
the value to beat, which prunes it early; models over the budget are left to the heuristic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from control_layer.planner import cost_model as cm
from control_layer.planner.bounds import lower_bounds
from control_layer.planner.problem import Problem, Solution, local_share

NODE_LIMIT = 1000
SAFETY_TIME_LIMIT_S = 2.0


@dataclass
class _Model:
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    row_lb: list[float] = field(default_factory=list)
    row_ub: list[float] = field(default_factory=list)

    def var(self, lb: float, ub: float, integer: bool) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(1 if integer else 0)
        return len(self.lb) - 1

    def row(self, terms: Sequence[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.row_lb)
        for col, val in terms:
            if val != 0.0:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(val)
        self.row_lb.append(lo)
        self.row_ub.append(hi)

    def solve(self, c: np.ndarray) -> np.ndarray | None:
        n = len(self.lb)
        a = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.row_lb), n)).tocsr()
        res = milp(
            c,
            integrality=np.array(self.integer),
            bounds=Bounds(np.array(self.lb), np.array(self.ub)),
            constraints=LinearConstraint(a, np.array(self.row_lb), np.array(self.row_ub)),
            options={"node_limit": NODE_LIMIT, "time_limit": SAFETY_TIME_LIMIT_S, "presolve": True},
        )
        return None if res.x is None else res.x


@dataclass
class _Vars:
    """The columns ``solve`` reads: per unit u, v1, v2, y1, y2 and x2; θ; the cost's linear terms."""

    v1: dict[int, int] = field(default_factory=dict)
    v2: dict[int, int] = field(default_factory=dict)
    y1: dict[int, int] = field(default_factory=dict)
    y2: dict[int, int] = field(default_factory=dict)
    x2: dict[int, int] = field(default_factory=dict)
    theta: int = -1
    cost_terms: list[tuple[int, float]] = field(default_factory=list)  # linear cost in USD


@dataclass
class _Regions:
    """Per region r: z_r (used) and its egress price per byte sent when it is used with another."""

    used: dict[int, int]
    egress: dict[int, int]


@dataclass
class _Ring:
    """The flat ring over P participants: the one-hot π_P, the slowest hop's seconds per GB and
    the largest hop latency present, and the largest values those and the egress can take (the
    linearisations' big-M constants)."""

    one_hot: dict[int, int]  # P -> the column of π_P
    s_per_gb: int
    latency: int
    most_s_per_gb: float = 0.0
    most_latency: float = 0.0
    most_egress: float = 0.0

    def hop(self, model: _Model, present: int, bw: float, lat: float) -> None:
        """A hop of ``bw`` bytes/s and ``lat`` seconds, in the ring whenever ``present`` is 1."""
        s_per_gb = cm.GB / bw  # seconds per GB keeps coefficients near 1
        self.most_s_per_gb, self.most_latency = max(self.most_s_per_gb, s_per_gb), max(self.most_latency, lat)
        model.row([(self.s_per_gb, 1.0), (present, -s_per_gb)], 0.0, math.inf)
        model.row([(self.latency, 1.0), (present, -lat)], 0.0, math.inf)

    def link(self, model: _Model, used_a: int, used_b: int, bw: float, lat: float) -> None:
        """The link between two regions, in the ring whenever both are used."""
        s_per_gb = cm.GB / bw
        self.most_s_per_gb, self.most_latency = max(self.most_s_per_gb, s_per_gb), max(self.most_latency, lat)
        model.row([(self.s_per_gb, 1.0), (used_a, -s_per_gb), (used_b, -s_per_gb)], -s_per_gb, math.inf)
        model.row([(self.latency, 1.0), (used_a, -lat), (used_b, -lat)], -lat, math.inf)


@dataclass
class _LocalStep:
    """The slowest used replica's local step with its writes and fixed seconds (``slowest``),
    and what the writes and fixed seconds add to it (``extra``); per unit, that step with one
    replica on a member and with several (alone, shared)."""

    slowest: int
    extra: int
    alone: np.ndarray
    shared: np.ndarray


def _add_members(model: _Model, pr: Problem, units: list[int]) -> _Vars:
    """Per unit, v1, v2, y1, y2 and x2 within its members and its replicas per member; then dp
    replicas in all."""
    columns = _Vars()
    for u in units:
        count, cap, least = int(pr.count[u]), int(pr.cap[u]), int(pr.lo[u])
        single_ok = least <= 1
        multi_ok = cap >= 2
        v1 = columns.v1[u] = model.var(0, 1 if single_ok else 0, True)
        v2 = columns.v2[u] = model.var(0, 1 if multi_ok else 0, True)
        y1 = columns.y1[u] = model.var(0, count if single_ok else 0, True)
        y2 = columns.y2[u] = model.var(0, count if multi_ok else 0, True)
        x2 = columns.x2[u] = model.var(0, count * cap if multi_ok else 0, True)
        model.row([(y1, 1.0), (v1, -float(count))], -math.inf, 0.0)
        model.row([(y1, 1.0), (v1, -1.0)], 0.0, math.inf)
        model.row([(y2, 1.0), (v2, -float(count))], -math.inf, 0.0)
        model.row([(y2, 1.0), (v2, -1.0)], 0.0, math.inf)
        model.row([(y1, 1.0), (y2, 1.0)], -math.inf, float(count))
        model.row([(x2, 1.0), (y2, -float(max(2, least)))], 0.0, math.inf)
        model.row([(x2, 1.0), (y2, -float(cap))], -math.inf, 0.0)
    model.row(
        [(columns.y1[u], 1.0) for u in units] + [(columns.x2[u], 1.0) for u in units], pr.deg.dp, pr.deg.dp
    )
    return columns


def _add_regions(
    model: _Model, pr: Problem, units: list[int], regions: list[int], columns: _Vars
) -> _Regions:
    """z_r is 1 exactly when some unit of region r is used."""
    out = _Regions({}, {})
    for r in regions:
        used = out.used[r] = model.var(0, 1, True)
        out.egress[r] = model.var(0, math.inf, False)
        mine = [u for u in units if pr.region[u] == r]
        for u in mine:
            model.row([(used, 1.0), (columns.v1[u], -1.0)], 0.0, math.inf)
            model.row([(used, 1.0), (columns.v2[u], -1.0)], 0.0, math.inf)
        model.row(
            [(used, 1.0)] + [(columns.v1[u], -1.0) for u in mine] + [(columns.v2[u], -1.0) for u in mine],
            -math.inf,
            0.0,
        )
    return out


def _add_ring(model: _Model, pr: Problem, units: list[int], columns: _Vars) -> _Ring:
    """The one-hot π_P over the participants P (one per node), Σ (y1 + y2) = P."""
    p_max = int(min(pr.deg.dp, sum(int(pr.count[u]) for u in units)))
    one_hot = {p: model.var(0, 1, True) for p in range(1, p_max + 1)}
    model.row([(pi, 1.0) for pi in one_hot.values()], 1.0, 1.0)
    model.row(
        [(columns.y1[u], 1.0) for u in units]
        + [(columns.y2[u], 1.0) for u in units]
        + [(pi, -float(p)) for p, pi in one_hot.items()],
        0.0,
        0.0,
    )
    return _Ring(one_hot, model.var(0, math.inf, False), model.var(0, math.inf, False))


def _add_unit_hops(
    model: _Model, pr: Problem, units: list[int], columns: _Vars, ring: _Ring
) -> dict[int, int]:
    """Per unit, whether it is used; a unit's fabric is a hop where two or more of its nodes in
    its first cluster (filled first, the one holding most of them) take part. A class with one
    node per cluster crosses the local link instead."""
    fleet = pr.fleet
    used: dict[int, int] = {}
    for u in units:
        count = float(pr.count[u])
        used[u] = model.var(0, 1, True)
        model.row([(used[u], 1.0), (columns.v1[u], -1.0)], 0.0, math.inf)
        model.row([(used[u], 1.0), (columns.v2[u], -1.0)], 0.0, math.inf)
        if pr.count[u] >= 2 and fleet.cls_first_cluster[u] >= 2:
            two_here = model.var(0, 1, True)
            model.row([(two_here, count), (columns.y1[u], -1.0), (columns.y2[u], -1.0)], -1.0, math.inf)
            ring.hop(model, two_here, float(fleet.cls_port_bw[u]), float(fleet.cls_hop_lat[u]))
    return used


def _add_region_hops(
    model: _Model,
    pr: Problem,
    units: list[int],
    regions: list[int],
    used: dict[int, int],
    columns: _Vars,
    ring: _Ring,
) -> None:
    """Per region, whether its nodes span two or more clusters (its local link is then a hop), and
    the fabric of a cluster two used units share."""
    fleet = pr.fleet
    for r in regions:
        mine = [u for u in units if pr.region[u] == r]
        spans = model.var(0, 1, True)
        for i, u in enumerate(mine):
            for other in mine[i + 1 :]:
                if fleet.cls_first_cid[u] != fleet.cls_first_cid[other]:
                    model.row([(spans, 1.0), (used[u], -1.0), (used[other], -1.0)], -1.0, math.inf)
                    continue
                # Two units of one cluster: within their first cluster they meet over its fabric
                # (beyond it, the row below makes them span clusters).
                both = model.var(0, 1, True)
                model.row([(both, 1.0), (used[u], -1.0), (used[other], -1.0)], -1.0, math.inf)
                bw = min(float(fleet.cls_port_bw[u]), float(fleet.cls_port_bw[other]))
                ring.hop(model, both, bw, max(float(fleet.cls_hop_lat[u]), float(fleet.cls_hop_lat[other])))
            first = int(fleet.cls_first_cluster[u])
            if first < pr.count[u]:
                model.row(
                    [(spans, float(pr.count[u])), (columns.y1[u], -1.0), (columns.y2[u], -1.0)],
                    -float(first),
                    math.inf,
                )
        if float(fleet.local_bw[r]) <= 0:
            model.row([(spans, 1.0)], 0.0, 0.0)
        else:
            ring.hop(model, spans, float(fleet.local_bw[r]), float(fleet.local_lat[r]))


def _add_region_links(model: _Model, pr: Problem, regions: list[int], used: _Regions, ring: _Ring) -> None:
    """The links between used regions are hops, and each region's egress price is its dearest
    link to another used region; two regions without a link are never both used."""
    fleet = pr.fleet
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            bw = float(fleet.pair_bw[a, b])
            if bw <= 0:
                model.row([(used.used[a], 1.0), (used.used[b], 1.0)], -math.inf, 1.0)
                continue
            ring.link(model, used.used[a], used.used[b], bw, float(fleet.pair_lat[a, b]))
            for src, dst in ((a, b), (b, a)):
                price = float(fleet.egress[src, dst])
                model.row(
                    [(used.egress[src], 1.0), (used.used[a], -price), (used.used[b], -price)],
                    -price,
                    math.inf,
                )
    for r in regions:
        others = [float(fleet.egress[r, d]) for d in regions if d != r]
        ring.most_egress += max(others, default=0.0)


def _add_exchange(
    model: _Model, pr: Problem, regions: list[int], used: _Regions, ring: _Ring
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(seconds, bytes across regions) of one exchange as linear terms: π_P times the slowest
    hop's seconds per GB, its latency and the egress prices, each linearised exactly (a binary
    times a bounded continuous variable), at P's bytes and hops; plus the leaders' work."""
    spec, fleet = pr.fleet.spec, pr.fleet
    n_params = float(spec.model.n_params)
    seconds: list[tuple[int, float]] = []
    egress: list[tuple[int, float]] = []
    for p, pi in ring.one_hot.items():
        if p < 2:
            continue
        at_bw = model.var(0, math.inf, False)
        at_latency = model.var(0, math.inf, False)
        at_egress = model.var(0, math.inf, False)
        big_bw, big_lat, big_eg = ring.most_s_per_gb, ring.most_latency, ring.most_egress
        model.row([(at_bw, 1.0), (ring.s_per_gb, -1.0), (pi, -big_bw)], -big_bw, math.inf)
        model.row([(at_latency, 1.0), (ring.latency, -1.0), (pi, -big_lat)], -big_lat, math.inf)
        model.row(
            [(at_egress, 1.0)] + [(used.egress[r], -1.0) for r in regions] + [(pi, -big_eg)],
            -big_eg,
            math.inf,
        )
        factor = float(cm.wan_time_factor(spec.sync, n_params, p))
        seconds += [(at_bw, factor / cm.GB), (at_latency, float(cm.wan_latency_hops(spec.sync, p)))]
        egress.append((at_egress, float(cm.wan_bytes_per_leader(spec.sync, n_params, p)) / cm.GB))
        # The leaders' per-parameter work, once per exchange (any two participants).
        seconds.append((pi, fleet.wan_param_s))
    return seconds, egress


def _add_local_step(model: _Model, pr: Problem, units: list[int], columns: _Vars) -> _LocalStep:
    """Local steps with their checkpoint writes and the run's fixed seconds per step (monotone in
    the step, so the max commutes; the cost θ × rate then counts the fixed seconds too)."""
    fleet = pr.fleet
    alone, shared = local_share(fleet, pr.t1), local_share(fleet, pr.t2)
    step = _LocalStep(model.var(0, math.inf, False), model.var(0, math.inf, False), alone, shared)
    # ``extra``: what the checkpoint writes and fixed seconds add to the slowest local step (they
    # rise with the step, so the largest of the units' is the slowest's): an overlapped exchange
    # that does not hide makes the step the exchange's share plus these.
    for u in units:
        model.row([(step.slowest, 1.0), (columns.v1[u], -float(alone[u]))], 0.0, math.inf)
        model.row([(step.slowest, 1.0), (columns.v2[u], -float(shared[u]))], 0.0, math.inf)
        model.row([(step.extra, 1.0), (columns.v1[u], -float(alone[u] - pr.t1[u]))], 0.0, math.inf)
        model.row([(step.extra, 1.0), (columns.v2[u], -float(shared[u] - pr.t2[u]))], 0.0, math.inf)
    # A node holding r ≥ 3 replicas rings its gradients among r: the fullest of a unit's y2
    # members holds ⌈x2/y2⌉ (``assign``), at least r exactly when x2 > (r−1)·y2.
    for u in units:
        cap, top = int(pr.cap[u]), int(pr.count[u] * pr.cap[u])
        if cap < 3:
            continue
        local_r = pr.t_shared(np.arange(3, cap + 1)[:, None])[:, u]  # the local step with r replicas
        for r, local, with_writes in zip(
            range(3, cap + 1), local_r, local_share(fleet, local_r), strict=True
        ):
            fullest = model.var(0, 1, True)
            model.row(
                [(columns.x2[u], 1.0), (columns.y2[u], -float(r - 1)), (fullest, -float(top))], -math.inf, 0.0
            )
            model.row([(step.slowest, 1.0), (fullest, -float(with_writes))], 0.0, math.inf)
            model.row([(step.extra, 1.0), (fullest, -float(with_writes - local))], 0.0, math.inf)
    return step


def _theta_bounds(
    pr: Problem, objective: str, beat: float, units: list[int], ring: _Ring, step: _LocalStep
) -> tuple[float, float]:
    """Bounds on θ that keep the linearisations tight: below, the bound from bounds.py; above,
    the deadline, the slowest unit plus the widest possible sync, and what ``beat`` allows."""
    spec, fleet = pr.fleet.spec, pr.fleet
    steps, n_params = spec.training.steps, float(spec.model.n_params)
    widest = max(len(ring.one_hot), 2)
    sync_ub = float(cm.wan_time_factor(spec.sync, n_params, widest)) / cm.GB * ring.most_s_per_gb
    sync_ub += float(cm.wan_latency_hops(spec.sync, widest)) * ring.most_latency + fleet.wan_param_s
    theta_ub = float(max(step.alone[units].max(), step.shared[units].max())) + pr.xps * sync_ub
    if spec.qos.max_hours is not None:
        theta_ub = min(theta_ub, spec.qos.max_hours * 3600.0 / steps)
    if math.isfinite(beat):
        if objective == "time":
            theta_ub = min(theta_ub, beat / steps)
        else:
            slots = np.repeat(pr.price[units], (pr.count * pr.cap)[units])
            rate_min = float(np.sort(slots)[: pr.deg.dp].sum()) * pr.dev
            theta_ub = min(theta_ub, beat * 3600.0 / (steps * rate_min))
    return min(lower_bounds(pr)[0] / steps, theta_ub), theta_ub


def _add_step(
    model: _Model, pr: Problem, theta: int, step: _LocalStep, sync: list[tuple[int, float]]
) -> None:
    """θ is at least the local step plus the exchange's share per step. Where the runtime overlaps
    the exchange (DiLoCo, async, ssp with staleness), a round lasts its H local steps or its
    exchange, whichever is longer (``runtime_pricing``: what does not hide behind the work
    blocks), so a step is the local one or the exchange's share plus the writes and fixed
    seconds; the last round's exchange blocks once."""
    fleet, xps, steps = pr.fleet, pr.xps, pr.fleet.spec.training.steps
    if fleet.runtime.diloco or pr.overlapped:
        wan_once = [(col, -coef / steps) for col, coef in sync]
        model.row([(theta, 1.0), (step.slowest, -1.0)] + wan_once, 0.0, math.inf)
        model.row(
            [(theta, 1.0), (step.extra, -1.0)] + [(col, -xps * coef) for col, coef in sync] + wan_once,
            0.0,
            math.inf,
        )
    else:
        model.row(
            [(theta, 1.0), (step.slowest, -1.0)] + [(col, -xps * coef) for col, coef in sync], 0.0, math.inf
        )


def _add_cost(
    model: _Model,
    pr: Problem,
    objective: str,
    beat: float,
    units: list[int],
    columns: _Vars,
    egress: list[tuple[int, float]],
    theta_lb: float,
    theta_ub: float,
) -> list[tuple[int, float]]:
    """The run's cost in USD as linear terms: its egress, and where the cost is an objective or a
    bound, θ × rate with each unit's replica count written in binary, x = Σ 2^j b_j, and θ·b_j
    linearised exactly; bounded by the spec's max_cost and what ``beat`` allows."""
    spec = pr.fleet.spec
    steps = spec.training.steps
    cost_terms: list[tuple[int, float]] = [(col, steps * pr.xps * coef) for col, coef in egress]
    if objective != "cost" and spec.qos.max_cost is None:
        return cost_terms
    scale = steps / 3600.0 * pr.dev
    theta = columns.theta
    for u in units:
        total = int(pr.count[u] * pr.cap[u])
        bits = []
        for j in range(total.bit_length()):
            bit = model.var(0, 1, True)
            theta_bit = model.var(0, theta_ub * (1 + 1e-9), False)
            bits.append((bit, float(1 << j)))
            model.row([(theta_bit, 1.0), (theta, -1.0), (bit, -theta_ub)], -theta_ub, math.inf)
            model.row([(theta_bit, 1.0), (bit, -theta_lb)], 0.0, math.inf)
            cost_terms.append((theta_bit, scale * float(pr.price[u]) * float(1 << j)))
        model.row(
            [(columns.y1[u], 1.0), (columns.x2[u], 1.0)] + [(bit, -weight) for bit, weight in bits], 0.0, 0.0
        )
    limit = min(spec.qos.max_cost or math.inf, beat if objective == "cost" else math.inf)
    if math.isfinite(limit):
        model.row(cost_terms, -math.inf, limit)
    return cost_terms


def integer_vars(pr: Problem, objective: str, above: float = math.inf) -> int:
    """Integer variables the model ``_build`` makes (the budget check). Every term is ≥ 0, so once
    the count passes ``above`` the rest is not counted: a model that large is not solved, and
    the partial count, already more than ``above``, says so."""
    ok = np.flatnonzero(pr.usable)
    # Per unit: v1, v2, y1, y2, x2 and whether it is used; per participant count, its one-hot.
    n = 6 * len(ok) + int(min(pr.deg.dp, int(pr.count[ok].sum())))
    if n > above:
        return n
    f = pr.fleet
    if objective == "cost" or f.spec.qos.max_cost is not None:
        n += sum(int(pr.count[u] * pr.cap[u]).bit_length() for u in ok)
    n += int(np.maximum(pr.cap[ok] - 2, 0).sum())  # a node's gradient ring of r ≥ 3
    n += int(((pr.count[ok] >= 2) & (f.cls_first_cluster[ok] >= 2)).sum())  # two nodes in one cluster
    cids = f.cls_first_cid[ok]
    n += sum(int(k) * (int(k) - 1) // 2 for k in np.unique(cids, return_counts=True)[1])  # one cluster
    regions = len(set(pr.region[ok].tolist()))
    return n + 2 * regions


def _build(pr: Problem, objective: str, beat: float) -> tuple[_Model, _Vars] | None:
    """The model of one candidate (docs/cost-model.md, "Search", defines its variables), built
    part by part in the order the solver sees its columns and rows."""
    units = [int(u) for u in np.flatnonzero(pr.usable)]
    if not units:
        return None
    model = _Model()
    columns = _add_members(model, pr, units)
    regions = sorted({int(pr.region[u]) for u in units})
    used_regions = _add_regions(model, pr, units, regions, columns)
    # The flat ring over P participants (one per node): a one-hot over P, and the ring's slowest
    # hop and largest latency over the hop kinds present (problem.sync_seconds_and_egress).
    ring = _add_ring(model, pr, units, columns)
    used_units = _add_unit_hops(model, pr, units, columns, ring)
    _add_region_hops(model, pr, units, regions, used_units, columns, ring)
    _add_region_links(model, pr, regions, used_regions, ring)
    sync, egress = _add_exchange(model, pr, regions, used_regions, ring)
    step = _add_local_step(model, pr, units, columns)
    theta_lb, theta_ub = _theta_bounds(pr, objective, beat, units, ring, step)
    columns.theta = model.var(theta_lb, theta_ub * (1 + 1e-9), False)
    _add_step(model, pr, columns.theta, step, sync)
    columns.cost_terms = _add_cost(model, pr, objective, beat, units, columns, egress, theta_lb, theta_ub)
    return model, columns


def solve(pr: Problem, objective: str, beat: float = math.inf) -> Solution | None:
    """The exact optimum of one candidate for the objective, or None (infeasible / over budget)."""
    built = _build(pr, objective, beat)
    if built is None:
        return None
    md, vs = built
    c = np.zeros(len(md.lb))
    if objective == "cost":
        for col, val in vs.cost_terms:
            c[col] += val
    else:
        c[vs.theta] = 1.0
        # Among equally fast plans prefer the cheaper device rate (weight far below one step).
        rate_scale = float(pr.price.max()) * pr.deg.dp + 1e-12
        tiny = 1e-7 * float(pr.t1.min()) / rate_scale
        for u in vs.y1:
            c[vs.y1[u]] += tiny * float(pr.price[u])
            c[vs.x2[u]] += tiny * float(pr.price[u])
    x = md.solve(c)
    if x is None:
        return None
    n1 = [0] * pr.n_units
    n2 = [0] * pr.n_units
    x2 = [0] * pr.n_units
    for u in vs.y1:
        n1[u] = int(round(x[vs.y1[u]]))
        n2[u] = int(round(x[vs.y2[u]]))
        x2[u] = int(round(x[vs.x2[u]]))
    return Solution(tuple(n1), tuple(n2), tuple(x2))


def milp_solutions(pr: Problem, objective: str, beat: float = math.inf) -> list[Solution]:
    """The exact optimum for the objective when something better than `beat` (seconds of
    duration, or USD) exists; otherwise nothing."""
    sol = solve(pr, objective, beat)
    return [] if sol is None else [sol]
