"""The search's fast scoring paths against plain dense forms of the same rules.

``evaluate`` walks only the units a solution uses and prices a candidate's solutions in one
vectorised runtime pass; the heuristic reads each fill row's used units as (row, unit) entries
for its slowest in-region hop, keeps region sets and each set of used regions' links per fleet,
and pipeline pricing keeps the bare schedule apart from the links. Each is checked here against
a dense, one-at-a-time form written in this file (every unit, every region in a loop), value for
value: the fast paths must change no score and no option.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.job_spec import SyncSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.bounds import lower_bounds
from control_layer.planner.estimate import device_price
from control_layer.planner.exhaustive import all_solutions
from control_layer.planner.fleet import Pool, _cluster_pools, _fleet_pools
from control_layer.planner.heuristic import (
    ANCHORS,
    _grow_region_sets,
    _in_region_hops,
    _score,
    candidate_solutions,
)
from control_layer.planner.milp import _build, integer_vars
from control_layer.planner.problem import (
    Problem,
    Score,
    Solution,
    build_problem,
    evaluate,
    evaluate_many,
    region_links,
    runtime_step,
)
from control_layer.planner.screen import screen
from control_layer.planner.snapshot import NodeProfileInfo

from .fleetgen import jobs, snapshots
from .test_search import _problems

FAST = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _dense_sync(pr: Problem, used: np.ndarray) -> tuple[float, float]:
    """The flat ring's seconds and USD over every unit and region, one at a time."""
    f = pr.fleet
    n_reg = len(f.regions)
    members = [0] * n_reg
    for u in range(pr.n_units):
        members[int(pr.region[u])] += int(used[u])
    p_count = sum(members)
    if p_count < 2:
        return 0.0, 0.0
    bw, lat = math.inf, 0.0
    for r in range(n_reg):
        if members[r] < 2:
            continue
        here = [u for u in range(pr.n_units) if pr.region[u] == r and used[u] > 0]
        one_cluster = len({int(f.cls_first_cid[u]) for u in here}) == 1
        if one_cluster and all(used[u] <= f.cls_first_cluster[u] for u in here):
            for u in here:
                bw, lat = min(bw, float(f.cls_intra_bw[u])), max(lat, float(f.cls_hop_lat[u]))
            continue
        bw, lat = min(bw, float(f.local_bw[r])), max(lat, float(f.local_lat[r]))
        for u in here:
            # A cluster with two of its nodes: its first, when it has two or more of them, or a
            # first cluster two used units share.
            twice = sum(int(f.cls_first_cid[w]) == int(f.cls_first_cid[u]) for w in here) >= 2
            if (used[u] >= 2 and f.cls_first_cluster[u] >= 2) or twice:
                bw, lat = min(bw, float(f.cls_intra_bw[u])), max(lat, float(f.cls_hop_lat[u]))
    regions = [r for r in range(n_reg) if members[r] > 0]
    egress = 0.0
    if len(regions) >= 2:
        for a in regions:
            worst = -math.inf
            for b in regions:
                if a != b:
                    bw = min(bw, float(f.pair_bw[a, b]))
                    lat = max(lat, float(f.pair_lat[a, b]))
                    worst = max(worst, float(f.egress[a, b]))
            egress += worst
        per = float(cm.wan_bytes_per_leader(f.spec.sync, float(f.spec.model.n_params), p_count))
        egress *= per / cm.GB
    if bw <= 0:
        return math.inf, math.inf
    t = float(cm.ring_sync_s(f.spec.sync, float(f.spec.model.n_params), p_count, bw, lat))
    return t + f.wan_param_s, egress


def _dense_evaluate(pr: Problem, sol: Solution) -> Score | None:
    n1, n2, x2 = (np.array(v, dtype=np.int64) for v in (sol.n1, sol.n2, sol.x2))
    if int((n1 + x2).sum()) != pr.deg.dp:
        return None
    if np.any(n1 + n2 > pr.count) or np.any(n1 < 0) or np.any(n2 < 0) or np.any((n1 > 0) & (pr.lo > 1)):
        return None
    if np.any(x2 < np.where(n2 > 0, n2 * np.maximum(2, pr.lo), 0)) or np.any(x2 > n2 * pr.cap):
        return None
    t_local = max(
        float(pr.t1[n1 > 0].max()) if (n1 > 0).any() else 0.0,
        float(pr.t_shared(-(-x2 // np.maximum(n2, 1)))[n2 > 0].max()) if (n2 > 0).any() else 0.0,
    )
    t_sync, egress = _dense_sync(pr, n1 + n2)
    if not math.isfinite(t_sync):
        return None
    members = np.bincount(pr.region, weights=n1 + n2, minlength=len(pr.fleet.regions))
    step, final = runtime_step(pr, t_local, t_sync, int(members.sum()))
    f = pr.fleet
    steps = f.spec.training.steps
    fixed = f.fixed_s + float(final)
    rate = float((pr.price * (n1 + x2)).sum()) * pr.dev
    return Score(
        float(step),
        t_local,
        t_sync,
        (fixed + steps * float(step)) * rate / 3600.0,
        steps * pr.xps * egress,
        steps,
        fixed,
    )


def _broken(sol: Solution, rnd: random.Random) -> Solution:
    """The solution with one count moved off by one (often breaking a structural rule)."""
    parts = [list(sol.n1), list(sol.n2), list(sol.x2)]
    k, u = rnd.randrange(3), rnd.randrange(len(sol.n1))
    parts[k][u] += rnd.choice((-1, 1))
    return Solution(tuple(parts[0]), tuple(parts[1]), tuple(parts[2]))


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), seed=st.integers(0, 2**16))
def test_evaluate_equals_the_dense_form_value_for_value(snap, spec, seed) -> None:
    rnd = random.Random(seed)
    _, problems = _problems(spec, snap)
    for pr in problems[:8]:
        sols = list(all_solutions(pr))
        sols = rnd.sample(sols, min(12, len(sols)))
        sols += [_broken(s, rnd) for s in sols[:4]]
        # With the units named, as the heuristic makes them (scoring walks only those).
        sols += [
            Solution(
                s.n1, s.n2, s.x2, units=tuple(u for u in range(pr.n_units) if s.n1[u] or s.n2[u] or s.x2[u])
            )
            for s in sols[:4]
        ]
        batch = evaluate_many(pr, sols)
        for sol, got in zip(sols, batch, strict=True):
            want = _dense_evaluate(pr, sol)
            assert got == want  # exactly: the same floats, not merely close
            assert evaluate(pr, sol) == want


def _hops_by_loop(pr: Problem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per fill row, the slowest hop inside regions with ≥ 2 nodes and the slowest of their
    hierarchical gathers: a loop over regions."""
    f = pr.fleet
    cols = np.flatnonzero(x.any(axis=0))
    members = np.where(x[:, cols] > 0, np.maximum(1, -(-x[:, cols] // np.maximum(pr.cap[cols], 1))), 0)
    in_bw, in_lat, gather = np.full(len(x), np.inf), np.zeros(len(x)), np.zeros(len(x))
    n = float(f.spec.model.n_params)
    for i, row in enumerate(members):
        for r in np.unique(pr.region[cols]):
            here = pr.region[cols] == r
            m = row[here]
            if m.sum() < 2:
                continue
            used = np.flatnonzero(m > 0)
            fab_bw, fab_lat = f.cls_intra_bw[cols][here], f.cls_hop_lat[cols][here]
            first = f.cls_first_cluster[cols][here]
            cids = f.cls_first_cid[cols][here]
            if len({int(cids[k]) for k in used}) == 1 and all(m[k] <= first[k] for k in used):
                bw, lat = min(fab_bw[k] for k in used), max(fab_lat[k] for k in used)
            else:
                twice = np.array(
                    [sum(int(cids[j]) == int(cids[k]) for j in used) >= 2 for k in range(len(m))]
                )
                many = ((m >= 2) & (first >= 2)) | ((m > 0) & twice)
                bw = min([f.local_bw[r], *fab_bw[many]])
                lat = max([f.local_lat[r], *fab_lat[many]])
            in_bw[i], in_lat[i] = min(in_bw[i], bw), max(in_lat[i], lat)
            gather[i] = max(gather[i], float(cm.region_gather_s(f.spec.sync, n, m.sum(), bw, lat)))
    return in_bw, in_lat, gather


def _score_by_loop(pr: Problem, x: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """heuristic._score with its in-region hops and region pairs read one row at a time, over
    every region the rows use."""
    f, spec = pr.fleet, pr.fleet.spec
    cols = np.flatnonzero(x.any(axis=0))
    xc = x[:, cols]
    t1, t2, lo, cap = pr.t1[cols], pr.t2[cols], pr.lo[cols], pr.cap[cols]
    single = (xc == 1) & (lo <= 1)[None, :] & (t1[None, :] <= levels[:, None])
    t_local = np.where(xc > 0, np.where(single, t1[None, :], t2[None, :]), 0.0).max(axis=1)
    members = np.where(xc > 0, np.maximum(1, -(-xc // np.maximum(cap, 1))), 0)
    in_bw, in_lat, gather = _hops_by_loop(pr, x)
    regs = np.unique(pr.region[cols])
    bw, lat, eg = np.full(len(x), np.inf), np.zeros(len(x)), np.zeros(len(x))
    n_used = np.zeros(len(x), dtype=int)
    largest = np.zeros(len(x), dtype=int)
    for i, row in enumerate(members):
        used = [r for r in regs if row[pr.region[cols] == r].sum() > 0]
        n_used[i] = len(used)
        largest[i] = max(row[pr.region[cols] == r].sum() for r in regs)
        for a in used:
            for b in used:
                if a != b:
                    bw[i], lat[i] = min(bw[i], f.pair_bw[a, b]), max(lat[i], f.pair_lat[a, b])
        eg[i] = np.array(
            [max([f.egress[a, b] for b in used if b != a], default=0.0) if a in used else 0.0 for a in regs]
        ).sum()
    multi = n_used >= 2
    n_part = members.sum(axis=1)
    hop_bw = np.minimum(in_bw, np.where(multi, bw, np.inf))
    hop_lat = np.maximum(in_lat, np.where(multi, lat, 0.0))
    ring = n_part >= 2
    n_params = float(spec.model.n_params)
    safe_bw = np.where(ring & (hop_bw > 0) & np.isfinite(hop_bw), hop_bw, 1.0)
    t_sync = np.where(ring, cm.ring_sync_s(spec.sync, n_params, np.maximum(n_part, 2), safe_bw, hop_lat), 0.0)
    t_sync = np.where(ring & (hop_bw <= 0), np.inf, t_sync)
    per = cm.wan_bytes_per_leader(spec.sync, n_params, n_part)
    for i in range(len(x)):  # the hierarchical exchange where it is faster, row by row
        if multi[i] and largest[i] >= 2 and in_bw[i] > 0 and bw[i] > 0:
            parts = cm.hierarchical_parts(spec.sync, n_params, n_used[i], gather[i], bw[i], lat[i])
            hier = float(parts[0] + parts[1])
            if cm.hierarchical_pays(spec.sync, n_used[i], largest[i], t_sync[i], hier):
                t_sync[i], per[i] = hier, cm.wan_bytes_per_leader(spec.sync, n_params, n_used[i])
    t_sync = t_sync + np.where(ring, f.wan_param_s, 0.0)
    step, final = runtime_step(pr, t_local, t_sync, n_part)
    steps = spec.training.steps
    rate = (xc * pr.price[cols][None, :]).sum(axis=1) * pr.dev
    duration = steps * step + final + f.fixed_s
    cost = duration * rate / 3600.0 + steps * pr.xps * np.where(multi, per / cm.GB * eg, 0.0)
    return duration / steps, cost


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), seed=st.integers(0, 2**16))
def test_fill_scores_match_a_loop_over_rows_and_regions(snap, spec, seed) -> None:
    """The heuristic reads region pairs once per distinct set of used regions, and in-region hops
    only where some row has two or more participants: the same floats as row by row."""
    rng = np.random.default_rng(seed)
    _, problems = _problems(spec, snap)
    for pr in problems[:6]:
        cap = np.maximum(pr.count * pr.cap, 0)
        if not cap.any():
            continue
        x = rng.integers(0, cap + 1, size=(6, pr.n_units)) * rng.integers(0, 2, size=(6, pr.n_units))
        x = np.concatenate([x, x[:2]])  # repeated sets of regions
        x = x[x.any(axis=1)]
        if not len(x):
            continue
        levels = rng.choice(np.concatenate([pr.t1, pr.t2]), size=len(x))
        got = _score(pr, x, levels)
        want = _score_by_loop(pr, x, levels)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), seed=st.integers(0, 2**16))
def test_in_region_hops_match_a_loop_over_regions(snap, spec, seed) -> None:
    rng = np.random.default_rng(seed)
    _, problems = _problems(spec, snap)
    for pr in problems[:6]:
        cap = np.maximum(pr.count * pr.cap, 0)
        if not cap.any():
            continue
        x = rng.integers(0, cap + 1, size=(5, pr.n_units)) * rng.integers(0, 2, size=(5, pr.n_units))
        x = x[x.any(axis=1)]
        if not len(x):
            continue
        rows, units = np.nonzero(x)
        members = -(-x[rows, units] // np.maximum(pr.cap[units], 1))
        regs, region_of = np.unique(pr.region[units], return_inverse=True)
        per_region = np.zeros((len(x), len(regs)))
        for i, r, m in zip(rows, region_of, members, strict=True):
            per_region[i, r] += m
        got = _in_region_hops(pr.fleet, rows, units, members, regs, region_of.reshape(-1), per_region)
        want = _hops_by_loop(pr, x)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False))
def test_region_sets_kept_across_candidates_and_quotes_change_no_candidate(snap, spec) -> None:
    """Candidates share the region-set memo kept with the snapshot (per pool list and
    calibration); each gets what it would with an empty one, in this quote and the next."""
    fleet, problems = _problems(spec, snap)
    if fleet is None:
        return
    shared = [candidate_solutions(pr) for pr in problems]  # the memo filling up
    again, _ = _problems(spec, snap)  # the next quote on the same snapshot
    assert again.region_sets is fleet.region_sets
    for pr, got in zip(problems, shared, strict=True):
        fresh = dataclasses.replace(fleet, region_sets={}, growth_orders={}, fill_links={}, layouts={})
        assert candidate_solutions(build_problem(fresh, pr.deg)) == got
        assert candidate_solutions(build_problem(again, pr.deg)) == got


def _region_sets_by_loop(pr: Problem, unit_cap: np.ndarray) -> list[np.ndarray]:
    """Compact region sets grown region by region from each anchor until there is room for dp,
    every step choosing afresh among all regions (no kept order)."""
    f = pr.fleet
    n_reg = len(f.regions)
    reg_cap = np.bincount(pr.region, weights=unit_cap, minlength=n_reg)
    cheapest = np.full(n_reg, np.inf)
    np.minimum.at(cheapest, pr.region[unit_cap > 0], pr.price[unit_cap > 0])
    anchors: list[int] = []
    for order in (np.argsort(-reg_cap, kind="stable"), np.argsort(cheapest, kind="stable")):
        anchors += [int(a) for a in order[:ANCHORS] if reg_cap[a] > 0 and int(a) not in anchors]
    sets = [reg_cap > 0]
    for a in anchors:
        member = np.arange(n_reg) == a
        room = reg_cap[a]
        while room < pr.deg.dp:
            # The region with room whose slowest link to every member is fastest (first on a tie).
            best, best_bw = -1, -math.inf
            for b in range(n_reg):
                if member[b] or reg_cap[b] <= 0:
                    continue
                worst = min(float(f.pair_bw[m, b]) for m in np.flatnonzero(member))
                if worst > 0 and worst > best_bw:
                    best, best_bw = b, worst
            if best < 0:
                break
            member[best] = True
            room += reg_cap[best]
        if room >= pr.deg.dp and not any(np.array_equal(member, m) for m in sets):
            sets.append(member)
    return sets


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), seed=st.integers(0, 2**16))
def test_region_sets_from_kept_growth_orders_match_growing_afresh(snap, spec, seed) -> None:
    """One kept growth order per (anchor, regions with room) serves every capacity and dp: each
    candidate's sets are those grown step by step from scratch, at capacities that differ per
    candidate (a kept order read with another stopping point)."""
    rng = np.random.default_rng(seed)
    _, problems = _problems(spec, snap)
    for pr in problems[:8]:
        full = np.where(pr.usable, pr.count * pr.cap, 0)
        for unit_cap in (full, full * rng.integers(0, 2, size=pr.n_units), rng.integers(0, full + 1)):
            got = _grow_region_sets(pr, unit_cap)
            want = _region_sets_by_loop(pr, unit_cap)
            assert [m.tolist() for m in got] == [m.tolist() for m in want]


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), pick=st.randoms(use_true_random=False))
def test_growth_orders_are_fresh_when_a_cluster_changes(snap, spec, pick) -> None:
    """A fleet with one cluster changed (its devices taken, as an allocation does) is a new
    snapshot: it starts from empty growth orders, and its candidates get what empty memos give."""
    fleet, problems = _problems(spec, snap)
    if fleet is None:
        return
    for pr in problems[:4]:
        candidate_solutions(pr)  # fills the kept orders
    gone = pick.randrange(len(snap.clusters))
    clusters = [
        c.model_copy(
            update={
                "nodes": [
                    n.model_copy(
                        update={"devices": [d.model_copy(update={"free": False}) for d in n.devices]}
                    )
                    for n in c.nodes
                ]
            }
        )
        if i == gone
        else c
        for i, c in enumerate(snap.clusters)
    ]
    changed_snap = type(snap)(
        regions=snap.regions, clusters=clusters, links=snap.links, taken_at=snap.taken_at
    )
    changed, changed_problems = _problems(spec, changed_snap)
    if changed is None:
        return
    assert changed.growth_orders is not fleet.growth_orders
    for pr in changed_problems[:4]:
        fresh = dataclasses.replace(changed, region_sets={}, growth_orders={}, fill_links={}, layouts={})
        assert candidate_solutions(pr) == candidate_solutions(build_problem(fresh, pr.deg))


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), pick=st.randoms(use_true_random=False))
def test_full_bounds_do_not_depend_on_the_rows_computed_with_them(snap, spec, pick) -> None:
    """Full bounds computed a few rows at a time (the candidates the search says it may ask about
    next, any subset) equal those of every row of the layout at once, bit for bit."""
    fleet, problems = _problems(spec, snap)
    if fleet is None:
        return
    degrees = [pr.deg for pr in problems]
    verdicts, whole = screen(fleet, degrees, pinned_zero=False)
    ok = [v.deg for v in verdicts if v.status == "ok"]
    if not ok:
        return
    _, some = screen(fleet, degrees, pinned_zero=False)
    asked = set(pick.sample(ok, pick.randint(1, len(ok))))
    some.ask_only(asked)
    likely = set(pick.sample(sorted(asked), pick.randint(0, len(asked))))
    order = sorted(asked)
    pick.shuffle(order)
    for deg in order:
        assert some.full(deg, likely.__contains__ if pick.random() < 0.7 else None) == whole.full(deg)


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), above=st.integers(0, 200))
def test_integer_vars_stopped_early_still_tell_too_large_apart(snap, spec, above) -> None:
    """Counting stops once past ``above``: the model is too large exactly when the full count is,
    and a count within it is the full count."""
    _, problems = _problems(spec, snap)
    for pr in problems[:8]:
        for objective in ("time", "cost"):
            whole = integer_vars(pr, objective)
            early = integer_vars(pr, objective, above=above)
            assert (early > above) == (whole > above)
            if whole <= above:
                assert early == whole


@FAST
@given(snap=snapshots(), spec=jobs())
def test_integer_vars_counts_the_model_built(snap, spec) -> None:
    """The budget counts the integer variables the MILP is built with, QoS cost caps included."""
    _, problems = _problems(spec, snap)
    for pr in problems[:8]:
        for objective in ("time", "cost"):
            built = _build(pr, objective, math.inf)
            if built is not None:
                assert integer_vars(pr, objective) == sum(built[0].integer)


@given(
    mode=st.sampled_from(["sync", "diloco", "local_sgd", "gossip", "ssp", "async"]),
    regions=st.lists(st.integers(0, 40), min_size=1, max_size=12),
)
def test_latency_hops_over_arrays_equal_exchange_rounds_one_at_a_time(mode, regions) -> None:
    sync = SyncSpec(mode=mode)
    got = cm.wan_latency_hops(sync, np.array(regions))
    assert got.tolist() == [2.0 * cm.exchange_rounds(sync, r) for r in regions]
    assert float(cm.wan_latency_hops(sync, regions[0])) == 2.0 * cm.exchange_rounds(sync, regions[0])


def _links_dense(f, regions: tuple[int, ...]) -> tuple[float, float, float]:
    """Slowest link, highest latency and Σ dearest egress among the regions, pair by pair."""
    pairs = [(a, b) for a in regions for b in regions if a != b]
    return (
        min(float(f.pair_bw[a, b]) for a, b in pairs),
        max(float(f.pair_lat[a, b]) for a, b in pairs),
        sum(max(float(f.egress[a, b]) for b in regions if b != a) for a in regions),
    )


def _slower_links(snap):
    """The snapshot with every link ten times slower and dearer, its other contents unchanged."""
    links = [
        ln.model_copy(
            update={
                "bandwidth_gbps": ln.bandwidth_gbps / 10,
                "egress_price_per_gb": ln.egress_price_per_gb * 10 + 0.01,
            }
        )
        for ln in snap.links
    ]
    return type(snap)(regions=snap.regions, clusters=snap.clusters, links=links, taken_at=snap.taken_at)


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), pick=st.randoms(use_true_random=False))
def test_region_links_and_wan_orders_kept_per_snapshot_are_fresh_on_a_changed_one(snap, spec, pick) -> None:
    """The region links kept with the snapshot (per pool list and calibration) give what the pairs
    give now, and a changed snapshot starts from empty memos: its own links, not the old ones."""
    fleet, problems = _problems(spec, snap)
    if fleet is None or len(fleet.regions) < 2:
        return
    for pr in problems[:4]:
        candidate_solutions(pr)  # fills the memos through the scoring and the bounds
        lower_bounds(pr)
    n_reg = len(fleet.regions)
    sets = {tuple(sorted(pick.sample(range(n_reg), pick.randint(2, n_reg)))) for _ in range(6)}
    for regions in sets:
        assert region_links(fleet, regions) == _links_dense(fleet, regions)
    again, _ = _problems(spec, snap)
    assert again.region_links is fleet.region_links and again.wan_orders is fleet.wan_orders
    assert again.growth_orders is fleet.growth_orders and again.fill_links is fleet.fill_links
    changed, changed_problems = _problems(spec, _slower_links(snap))
    assert changed.region_links is not fleet.region_links and changed.wan_orders is not fleet.wan_orders
    assert changed.growth_orders is not fleet.growth_orders and changed.fill_links is not fleet.fill_links
    for regions in sets:
        assert region_links(changed, regions) == _links_dense(changed, regions)
    for pr in changed_problems[:4]:
        # The bounds read the kept link orders: the same as with empty memos on the changed fleet.
        fresh = dataclasses.replace(
            changed,
            region_links={},
            fill_links={},
            wan_orders={},
            region_sets={},
            growth_orders={},
            layouts={},
        )
        assert lower_bounds(pr) == lower_bounds(build_problem(fresh, pr.deg))
        assert evaluate_many(pr, candidate_solutions(pr)) == evaluate_many(
            build_problem(fresh, pr.deg), candidate_solutions(build_problem(fresh, pr.deg))
        )


def _pool_fields(pools) -> list[tuple]:
    return [
        (p.cluster.id, p.model, p.nodes, p.tflops, p.memory_gb, p.price, p.kind, p.free_per_node, p.region)
        + (p.measured_fixed,)
        for p in pools
    ]


@FAST
@given(snap=snapshots(), spot_first=st.booleans(), spot_price=st.floats(0.1, 5.0))
def test_pools_derived_from_the_other_price_setting_equal_fresh_ones(snap, spot_first, spot_price) -> None:
    """A cluster's pools at one price setting are derived from those kept at the other: the same
    as built from its devices, and a changed cluster (a new object) is built afresh."""
    snap = type(snap)(
        regions=snap.regions,
        clusters=[c.model_copy(update={"spot_price_per_device_hour": spot_price}) for c in snap.clusters],
        links=snap.links,
    )
    first = _fleet_pools(snap, spot_first)
    derived = _fleet_pools(snap, not spot_first)
    fresh = [p for c in sorted(snap.clusters, key=lambda c: c.id) for p in _cluster_pools(c, not spot_first)]
    assert _pool_fields(derived) == _pool_fields(fresh)

    # The start-up figures handed over node by node equal those a pool derives from its cluster.
    def measured(c):
        nodes = []
        for i, n in enumerate(c.nodes):
            prof = NodeProfileInfo(startup_s=1.0 + i, teardown_s=0.5 * i, host_load_factor=i)
            nodes.append(n.model_copy(update={"profile": prof}))
        return c.model_copy(update={"nodes": nodes})

    profiled = [measured(c) for c in snap.clusters]
    built = [p for c in profiled for p in _cluster_pools(c, spot_first)]
    walked = [Pool(p.cluster, p.model, p.nodes, p.tflops, p.memory_gb, p.price, p.kind) for p in built]
    assert _pool_fields(walked) == _pool_fields(built)
    assert all(fixed[1] is not None for p in built for fixed in p.measured_fixed)
    assert [p.price for p in first] == [device_price(p.cluster, spot_first) for p in first]
    dearer = type(snap)(
        regions=snap.regions,
        clusters=[
            c.model_copy(update={"price_per_device_hour": c.price_per_device_hour + 1.0})
            for c in snap.clusters
        ],
        links=snap.links,
    )
    again = _fleet_pools(dearer, not spot_first)
    assert [p.price for p in again] == [device_price(p.cluster, not spot_first) for p in again]


@FAST
@given(
    pp=st.integers(2, 5),
    m=st.integers(1, 24),
    times=st.lists(st.floats(1e-4, 1.0), min_size=10, max_size=10),
    nbytes=st.floats(1e3, 1e9),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    pick=st.randoms(use_true_random=False),
)
def test_pipeline_transfers_priced_against_a_bare_schedule_kept_apart_from_the_links(
    pp, m, times, nbytes, schedule, pick
) -> None:
    """The bare schedule (transfers take no time) is kept per stage times alone: the same as walked
    on any links, so a pipeline's transfer seconds are those of two walks on its own links."""
    fwd, bwd = tuple(times[:pp]), tuple(times[5 : 5 + pp])
    links = cm.PipelineLinks(
        port_out=tuple(pick.uniform(1e8, 1e11) for _ in range(pp)),
        port_in=tuple(pick.uniform(1e8, 1e11) for _ in range(pp)),
        across=tuple(pick.random() < 0.5 for _ in range(pp - 1)),
        latency=tuple(pick.uniform(0.0, 0.05) for _ in range(pp - 1)),
        local_bw=pick.uniform(1e9, 1e12),
        link_bw=tuple(pick.choice([math.inf, pick.uniform(1e7, 1e10)]) for _ in range(pp - 1)),
    )
    bare = cm._pipeline_makespan(m, fwd, bwd, links, 0.0, schedule)
    assert cm._bare_makespan(m, fwd, bwd, schedule) == bare

    def extra(n: int) -> float:
        return cm._pipeline_makespan(n, fwd, bwd, links, nbytes, schedule) - cm._pipeline_makespan(
            n, fwd, bwd, links, 0.0, schedule
        )

    m1, m2 = 2 * pp, 4 * pp
    want = extra(m) if m <= m2 else extra(m2) + (m - m2) * (extra(m2) - extra(m1)) / (m2 - m1)
    assert cm.pipeline_comm_s(pp, m, fwd, bwd, links, nbytes, schedule) == want
