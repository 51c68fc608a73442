"""Exact placement of one candidate as a MILP (scipy.optimize.milp, HiGHS).

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
    v1: dict[int, int]
    v2: dict[int, int]
    y1: dict[int, int]
    y2: dict[int, int]
    x2: dict[int, int]
    theta: int
    cost_terms: list[tuple[int, float]]  # linear cost in USD (cost objective only)


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
    return n + 3 * regions


def _build(pr: Problem, objective: str, beat: float) -> tuple[_Model, _Vars] | None:
    spec = pr.fleet.spec
    f = pr.fleet
    steps = spec.training.steps
    md = _Model()
    units = [int(u) for u in np.flatnonzero(pr.usable)]
    if not units:
        return None
    v1, v2, y1, y2, x2 = {}, {}, {}, {}, {}
    for u in units:
        cnt, cap, lo = int(pr.count[u]), int(pr.cap[u]), int(pr.lo[u])
        single_ok = lo <= 1
        multi_ok = cap >= 2
        v1[u] = md.var(0, 1 if single_ok else 0, True)
        v2[u] = md.var(0, 1 if multi_ok else 0, True)
        y1[u] = md.var(0, cnt if single_ok else 0, True)
        y2[u] = md.var(0, cnt if multi_ok else 0, True)
        x2[u] = md.var(0, cnt * cap if multi_ok else 0, True)
        md.row([(y1[u], 1.0), (v1[u], -float(cnt))], -math.inf, 0.0)
        md.row([(y1[u], 1.0), (v1[u], -1.0)], 0.0, math.inf)
        md.row([(y2[u], 1.0), (v2[u], -float(cnt))], -math.inf, 0.0)
        md.row([(y2[u], 1.0), (v2[u], -1.0)], 0.0, math.inf)
        md.row([(y1[u], 1.0), (y2[u], 1.0)], -math.inf, float(cnt))
        md.row([(x2[u], 1.0), (y2[u], -float(max(2, lo)))], 0.0, math.inf)
        md.row([(x2[u], 1.0), (y2[u], -float(cap))], -math.inf, 0.0)
    md.row([(y1[u], 1.0) for u in units] + [(x2[u], 1.0) for u in units], pr.deg.dp, pr.deg.dp)

    regions = sorted({int(pr.region[u]) for u in units})
    z, m, e = {}, {}, {}
    for r in regions:
        z[r] = md.var(0, 1, True)
        m[r] = md.var(0, 1, True)
        e[r] = md.var(0, math.inf, False)
        mine = [u for u in units if pr.region[u] == r]
        for u in mine:
            md.row([(z[r], 1.0), (v1[u], -1.0)], 0.0, math.inf)
            md.row([(z[r], 1.0), (v2[u], -1.0)], 0.0, math.inf)
        md.row([(z[r], 1.0)] + [(v1[u], -1.0) for u in mine] + [(v2[u], -1.0) for u in mine], -math.inf, 0.0)
        big = float(sum(int(pr.count[u]) for u in mine))
        md.row([(y1[u], 1.0) for u in mine] + [(y2[u], 1.0) for u in mine] + [(m[r], -big)], -math.inf, 1.0)

    # The flat ring over P participants (one per node): a one-hot over P, and the ring's slowest
    # hop and largest latency over the hop kinds present (problem.sync_seconds_and_egress).
    p_max = int(min(pr.deg.dp, sum(int(pr.count[u]) for u in units)))
    pi = {p: md.var(0, 1, True) for p in range(1, p_max + 1)}
    md.row([(pi[p], 1.0) for p in pi], 1.0, 1.0)
    md.row(
        [(y1[u], 1.0) for u in units] + [(y2[u], 1.0) for u in units] + [(pi[p], -float(p)) for p in pi],
        0.0,
        0.0,
    )
    t_ibw = md.var(0, math.inf, False)
    t_lat = md.var(0, math.inf, False)
    big_bw, big_lat, big_eg = 0.0, 0.0, 0.0

    def hop_rows(indicator: int, bw: float, lat: float) -> None:
        nonlocal big_bw, big_lat
        inv = cm.GB / bw  # seconds per GB keeps coefficients near 1
        big_bw, big_lat = max(big_bw, inv), max(big_lat, lat)
        md.row([(t_ibw, 1.0), (indicator, -inv)], 0.0, math.inf)
        md.row([(t_lat, 1.0), (indicator, -lat)], 0.0, math.inf)

    used_u: dict[int, int] = {}
    for u in units:
        cnt = float(pr.count[u])
        used_u[u] = md.var(0, 1, True)
        md.row([(used_u[u], 1.0), (v1[u], -1.0)], 0.0, math.inf)
        md.row([(used_u[u], 1.0), (v2[u], -1.0)], 0.0, math.inf)
        # Two or more of its nodes in its first cluster (filled first, the one holding most of
        # them): its fabric is a hop. A class with one node per cluster crosses the local link.
        if pr.count[u] >= 2 and f.cls_first_cluster[u] >= 2:
            q = md.var(0, 1, True)
            md.row([(q, cnt), (y1[u], -1.0), (y2[u], -1.0)], -1.0, math.inf)
            hop_rows(q, float(f.cls_intra_bw[u]), float(f.cls_hop_lat[u]))
    for r in regions:
        mine = [u for u in units if pr.region[u] == r]
        spans = md.var(0, 1, True)  # the region's nodes span two or more clusters: its local link
        for i, u in enumerate(mine):
            for w in mine[i + 1 :]:
                if f.cls_first_cid[u] != f.cls_first_cid[w]:
                    md.row([(spans, 1.0), (used_u[u], -1.0), (used_u[w], -1.0)], -1.0, math.inf)
                    continue
                # Two units of one cluster: within their first cluster they meet over its fabric
                # (beyond it, the row below makes them span clusters).
                q = md.var(0, 1, True)
                md.row([(q, 1.0), (used_u[u], -1.0), (used_u[w], -1.0)], -1.0, math.inf)
                bw = min(float(f.cls_intra_bw[u]), float(f.cls_intra_bw[w]))
                hop_rows(q, bw, max(float(f.cls_hop_lat[u]), float(f.cls_hop_lat[w])))
            first = int(f.cls_first_cluster[u])
            if first < pr.count[u]:
                md.row([(spans, float(pr.count[u])), (y1[u], -1.0), (y2[u], -1.0)], -float(first), math.inf)
        if float(f.local_bw[r]) <= 0:
            md.row([(spans, 1.0)], 0.0, 0.0)
        else:
            hop_rows(spans, float(f.local_bw[r]), float(f.local_lat[r]))

    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            bw = float(f.pair_bw[a, b])
            if bw <= 0:
                md.row([(z[a], 1.0), (z[b], 1.0)], -math.inf, 1.0)
                continue
            lat = float(f.pair_lat[a, b])
            inv = cm.GB / bw
            big_bw, big_lat = max(big_bw, inv), max(big_lat, lat)
            md.row([(t_ibw, 1.0), (z[a], -inv), (z[b], -inv)], -inv, math.inf)
            md.row([(t_lat, 1.0), (z[a], -lat), (z[b], -lat)], -lat, math.inf)
            for s, d in ((a, b), (b, a)):
                price = float(f.egress[s, d])
                md.row([(e[s], 1.0), (z[a], -price), (z[b], -price)], -price, math.inf)
    for r in regions:
        others = [float(f.egress[r, d]) for d in regions if d != r]
        big_eg += max(others, default=0.0)

    n_params = float(spec.model.n_params)
    sync_terms: list[tuple[int, float]] = []
    egress_terms: list[tuple[int, float]] = []
    for p, rp in pi.items():
        if p < 2:
            continue
        pb = md.var(0, math.inf, False)
        pl = md.var(0, math.inf, False)
        pe = md.var(0, math.inf, False)
        md.row([(pb, 1.0), (t_ibw, -1.0), (rp, -big_bw)], -big_bw, math.inf)
        md.row([(pl, 1.0), (t_lat, -1.0), (rp, -big_lat)], -big_lat, math.inf)
        md.row([(pe, 1.0)] + [(e[r], -1.0) for r in regions] + [(rp, -big_eg)], -big_eg, math.inf)
        factor = float(cm.wan_time_factor(spec.sync, n_params, p))
        sync_terms += [(pb, factor / cm.GB), (pl, float(cm.wan_latency_hops(spec.sync, p)))]
        egress_terms.append((pe, float(cm.wan_bytes_per_leader(spec.sync, n_params, p)) / cm.GB))
        # The leaders' per-parameter work, once per exchange (any two participants).
        sync_terms.append((rp, f.wan_param_s))

    # Local steps with their checkpoint writes and the run's fixed seconds per step (monotone in
    # the step, so the max commutes; the cost theta × rate then counts the fixed seconds too).
    g1, g2 = local_share(f, pr.t1), local_share(f, pr.t2)
    t_max = md.var(0, math.inf, False)
    # What the checkpoint writes and fixed seconds add to the slowest local step (they rise with
    # the step, so the largest of the units' is the slowest's): an overlapped exchange that does
    # not hide makes the step the exchange's share plus these.
    extra = md.var(0, math.inf, False)
    for u in units:
        md.row([(t_max, 1.0), (v1[u], -float(g1[u]))], 0.0, math.inf)
        md.row([(t_max, 1.0), (v2[u], -float(g2[u]))], 0.0, math.inf)
        md.row([(extra, 1.0), (v1[u], -float(g1[u] - pr.t1[u]))], 0.0, math.inf)
        md.row([(extra, 1.0), (v2[u], -float(g2[u] - pr.t2[u]))], 0.0, math.inf)
    # A node holding r ≥ 3 replicas rings its gradients among r: the fullest of a unit's y2
    # members holds ⌈x2/y2⌉ (``assign``), at least r exactly when x2 > (r−1)·y2.
    for u in units:
        cap, top = int(pr.cap[u]), int(pr.count[u] * pr.cap[u])
        if cap < 3:
            continue
        t_r = pr.t_shared(np.arange(3, cap + 1)[:, None])[:, u]
        for r, t, g in zip(range(3, cap + 1), t_r, local_share(f, t_r), strict=True):
            w = md.var(0, 1, True)
            md.row([(x2[u], 1.0), (y2[u], -float(r - 1)), (w, -float(top))], -math.inf, 0.0)
            md.row([(t_max, 1.0), (w, -float(g))], 0.0, math.inf)
            md.row([(extra, 1.0), (w, -float(g - t))], 0.0, math.inf)

    # Bounds on theta keep the linearisations tight: the bound from bounds.py below, and above
    # the deadline, the slowest unit plus the widest possible sync, and what `beat` allows.
    sync_ub = float(cm.wan_time_factor(spec.sync, n_params, max(p_max, 2))) / cm.GB * big_bw
    sync_ub += float(cm.wan_latency_hops(spec.sync, max(p_max, 2))) * big_lat + f.wan_param_s
    theta_ub = float(max(g1[units].max(), g2[units].max())) + pr.xps * sync_ub
    if spec.qos.max_hours is not None:
        theta_ub = min(theta_ub, spec.qos.max_hours * 3600.0 / steps)
    if math.isfinite(beat):
        if objective == "time":
            theta_ub = min(theta_ub, beat / steps)
        else:
            slots = np.repeat(pr.price[units], (pr.count * pr.cap)[units])
            rate_min = float(np.sort(slots)[: pr.deg.dp].sum()) * pr.dev
            theta_ub = min(theta_ub, beat * 3600.0 / (steps * rate_min))
    theta_lb = min(lower_bounds(pr)[0] / steps, theta_ub)
    theta = md.var(theta_lb, theta_ub * (1 + 1e-9), False)
    xps = pr.xps
    if f.runtime.diloco or pr.overlapped:
        # The runtime overlaps the exchange (DiLoCo, async, ssp with staleness): a round lasts
        # its H local steps or its exchange, whichever is longer (``runtime_pricing``: what does
        # not hide behind the work blocks), so a step is the local one or the exchange's share
        # plus the writes and fixed seconds; the last round's exchange blocks once.
        wan_once = [(v, -c / steps) for v, c in sync_terms]
        md.row([(theta, 1.0), (t_max, -1.0)] + wan_once, 0.0, math.inf)
        md.row(
            [(theta, 1.0), (extra, -1.0)] + [(v, -xps * c) for v, c in sync_terms] + wan_once, 0.0, math.inf
        )
    else:
        md.row([(theta, 1.0), (t_max, -1.0)] + [(v, -xps * c) for v, c in sync_terms], 0.0, math.inf)

    cost_terms: list[tuple[int, float]] = [(v, steps * xps * c) for v, c in egress_terms]
    if objective == "cost" or spec.qos.max_cost is not None:
        scale = steps / 3600.0 * pr.dev
        for u in units:
            total = int(pr.count[u] * pr.cap[u])
            bits = []
            for j in range(total.bit_length()):
                b = md.var(0, 1, True)
                q = md.var(0, theta_ub * (1 + 1e-9), False)
                bits.append((b, float(1 << j)))
                md.row([(q, 1.0), (theta, -1.0), (b, -theta_ub)], -theta_ub, math.inf)
                md.row([(q, 1.0), (b, -theta_lb)], 0.0, math.inf)
                cost_terms.append((q, scale * float(pr.price[u]) * float(1 << j)))
            md.row([(y1[u], 1.0), (x2[u], 1.0)] + [(b, -w) for b, w in bits], 0.0, 0.0)
        limit = min(spec.qos.max_cost or math.inf, beat if objective == "cost" else math.inf)
        if math.isfinite(limit):
            md.row(cost_terms, -math.inf, limit)
    return md, _Vars(v1, v2, y1, y2, x2, theta, cost_terms)


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
