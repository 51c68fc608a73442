"""Fast placement: fill the cheapest eligible units at each step-time level, over a few region sets.

A level τ admits the units whose replica step time is at most τ; filling the admitted units in
price order gives the cheapest device rate at that speed. The region sets tried are: all allowed
regions, and compact sets grown from an anchor region by adding, one at a time, the region with
the fastest slowest link to those already in (until there is room for dp replicas) — what
synchronous and WAN-bound modes need. Units are filled cheapest first, and also largest member
first (fewest participants in the sync). Every (set, order, level) fill is scored at once with
numpy; the best rows for time, cost and their balance are then split per member cluster.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from control_layer.planner import cost_model as cm
from control_layer.planner.problem import Fleet, Problem, Solution, runtime_step

MAX_LEVELS = 32  # step-time levels tried per region set (quantiles of the distinct unit times)
ANCHORS = 3  # anchor regions by capacity, and as many by price, for compact region sets
ROWS_PER_GOAL = 2  # best fills kept per goal (time, cost, balance)
SET_LEVELS = (0.0, 0.25, 1.0)  # quantiles of the feasible levels to grow region sets at
REGION_SETS_KEPT = 4096  # region sets kept per pool list and calibration (cleared when full)
FILL_LINKS_KEPT = 65536  # sets of used regions whose links are kept, likewise


def split(
    x: int, count: int, cap: int, lo: int, single_ok: bool, spread: bool
) -> tuple[int, int, int] | None:
    """Spread x replicas over a unit's members: (n1 members with one, n2 members with ≥ 2, x2)."""
    if x == 0:
        return (0, 0, 0)
    low = max(2, lo)
    if spread and single_ok and x <= count:
        return (x, 0, 0)
    # Pack: as few members as possible, each with ≥ low replicas; one single if that is all left.
    for n1 in (0, 1) if single_ok else (0,):
        rest = x - n1
        if rest == 0:
            return (n1, 0, 0) if n1 <= count else None
        n2 = math.ceil(rest / cap) if cap >= 2 else 0
        if n2 and n2 * low <= rest and n1 + n2 <= count and rest <= n2 * cap:
            return (n1, n2, rest)
    if single_ok and x <= count:
        return (x, 0, 0)
    return None


def _levels(pr: Problem, t1_ok: np.ndarray, t2_ok: np.ndarray) -> np.ndarray:
    levels = np.unique(np.concatenate([pr.t1[t1_ok], pr.t2[t2_ok]]))
    if len(levels) > MAX_LEVELS:
        pick = np.unique(np.round(np.linspace(0, len(levels) - 1, MAX_LEVELS)).astype(int))
        levels = levels[pick]
    return levels


def _region_sets(pr: Problem, unit_cap: np.ndarray) -> list[np.ndarray]:
    """Boolean region masks: all regions, then compact sets grown from anchor regions. They depend
    on the fleet's pools and links, the units' regions and prices (the same for every candidate
    of a quote, and for quotes on one snapshot with the same filters and calibration), the
    capacity per unit and dp, so they are kept with the fleet under the last two."""
    kept = pr.fleet.region_sets
    key = (unit_cap.tobytes(), pr.deg.dp)
    got = kept.get(key)
    if got is None:
        if len(kept) >= REGION_SETS_KEPT:
            kept.clear()
        got = kept[key] = _grow_region_sets(pr, unit_cap)
    return got


def _growth_order(pr: Problem, anchor: int, has_room: np.ndarray) -> list[int]:
    """The regions a compact set grown from ``anchor`` takes, in the order it takes them, until
    none is left: each time the region with room whose slowest link to those already in is
    fastest (the first such on a tie), never one unlinked to a member. The order follows from the
    anchor, which regions have room and the links alone (how much room only says where the
    growth stops), so it is kept with the fleet and shared by candidates and quotes."""
    kept = pr.fleet.growth_orders
    key = (anchor, has_room.tobytes())
    got = kept.get(key)
    if got is not None:
        return got
    f = pr.fleet
    n_reg = len(f.regions)
    member = np.zeros(n_reg, dtype=bool)
    member[anchor] = True
    worst = np.where(np.arange(n_reg) == anchor, -np.inf, f.pair_bw[anchor])  # slowest link into the set
    got = []
    while True:
        score = np.where(member | ~has_room | (worst <= 0), -np.inf, worst)
        b = int(np.argmax(score))
        if not np.isfinite(score[b]):
            break
        member[b] = True
        got.append(b)
        worst = np.minimum(worst, f.pair_bw[b])
    if len(kept) >= REGION_SETS_KEPT:
        kept.clear()
    kept[key] = got
    return got


def _grow_region_sets(pr: Problem, unit_cap: np.ndarray) -> list[np.ndarray]:
    f = pr.fleet
    n_reg = len(f.regions)
    reg_cap = np.bincount(pr.region, weights=unit_cap, minlength=n_reg)
    cheapest = np.full(n_reg, np.inf)
    has = unit_cap > 0
    np.minimum.at(cheapest, pr.region[has], pr.price[has])
    anchors: list[int] = []
    for order in (np.argsort(-reg_cap, kind="stable"), np.argsort(cheapest, kind="stable")):
        anchors += [int(a) for a in order[:ANCHORS] if reg_cap[a] > 0 and int(a) not in anchors]
    has_room = reg_cap > 0
    sets = [has_room]
    seen = {sets[0].tobytes()}
    caps = reg_cap.tolist()
    for a in anchors:
        # Grow until there is room for dp replicas (or no region is left to add).
        room = caps[a]
        taken = [a]
        if room < pr.deg.dp:
            for b in _growth_order(pr, a, has_room):
                taken.append(b)
                room += caps[b]
                if room >= pr.deg.dp:
                    break
        if room < pr.deg.dp:
            continue
        member = np.zeros(n_reg, dtype=bool)
        member[taken] = True
        key = member.tobytes()
        if key not in seen:
            seen.add(key)
            sets.append(member)
    return sets


def _in_region_hops(
    f: Fleet,
    rows: np.ndarray,
    units: np.ndarray,
    members: np.ndarray,
    regs: np.ndarray,
    region_of: np.ndarray,
    per_region: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per fill row, the slowest hop (bytes/s, seconds) inside the regions where it has two or more
    nodes, and the slowest of those regions' gathers (hierarchical), as
    problem.sync_seconds_and_egress takes them: within such a region, units whose nodes all lie in
    one cluster (each within its first cluster, the same for all) meet over that
    fabric, else over the local link and the fabric of every cluster holding two or more of
    their nodes: a unit's first cluster when it uses two or more nodes and that cluster has two or
    more, or when another unit there has the same first cluster.
    The rows come as entries (row, unit, members ≥ 1, index of the unit's region in ``regs``);
    each (row, region) cell is reduced over its entries, then over the rows × regions."""
    n_rows, n_reg = per_region.shape
    cell = rows * n_reg + region_of
    cids = f.cls_first_cid[units]
    least = np.full(n_rows * n_reg, np.iinfo(np.int64).max)
    most = np.full(n_rows * n_reg, -1, dtype=np.int64)
    np.minimum.at(least, cell, cids)
    np.maximum.at(most, cell, cids)
    # A unit misfits when its members outnumber those in its first cluster (≥ 1, so it is used).
    misfits = np.zeros(n_rows * n_reg, dtype=bool)
    misfits[cell[members > f.cls_first_cluster[units]]] = True
    alone = ((least == most) & ~misfits).reshape(n_rows, n_reg)
    # Where a region's units all lie in one cluster they meet over its fabric, each node through
    # its own port: the slowest of the units' ports and their highest hop latency.
    fit_bw = np.full(n_rows * n_reg, np.inf)
    fit_lat = np.zeros(n_rows * n_reg)
    np.minimum.at(fit_bw, cell, f.cls_port_bw[units])
    np.maximum.at(fit_lat, cell, f.cls_hop_lat[units])
    fit_bw, fit_lat = fit_bw.reshape(n_rows, n_reg), fit_lat.reshape(n_rows, n_reg)
    many = (members >= 2) & (f.cls_first_cluster[units] >= 2)
    if np.unique(f.cls_first_cid).size < f.cls_first_cid.size:  # some classes share a first cluster
        pair = cell * (int(f.cls_first_cid.max()) + 1) + cids
        _, at, seen = np.unique(pair, return_inverse=True, return_counts=True)
        many |= seen[at.reshape(-1)] >= 2
    many_bw = np.full(n_rows * n_reg, np.inf)
    many_lat = np.zeros(n_rows * n_reg)
    np.minimum.at(many_bw, cell[many], f.cls_port_bw[units[many]])
    np.maximum.at(many_lat, cell[many], f.cls_hop_lat[units[many]])
    span_bw = np.minimum(f.local_bw[regs][None, :], many_bw.reshape(n_rows, n_reg))
    span_lat = np.maximum(f.local_lat[regs][None, :], many_lat.reshape(n_rows, n_reg))
    one = alone & np.isfinite(fit_bw)
    active = per_region >= 2
    cell_bw = np.where(active, np.where(one, fit_bw, span_bw), np.inf)
    cell_lat = np.where(active, np.where(one, fit_lat, span_lat), 0.0)
    in_bw = cell_bw.min(axis=1)
    in_lat = np.maximum(0.0, cell_lat.max(axis=1))
    # The hierarchical exchange's slowest gather into a region's head (``cm.region_gather_s``).
    gather = cm.region_gather_s(f.spec.sync, float(f.spec.model.n_params), per_region, cell_bw, cell_lat)
    return in_bw, in_lat, gather.max(axis=1)


def _set_links(f: Fleet, sets: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per set of regions (a bitmask over the fleet's regions): the slowest link between two of its
    regions (inf with fewer than two), the highest latency (0 with fewer than two) and, per region
    of the fleet, its dearest egress to another of the set (0 outside the set or alone in it).
    They follow from the region pairs alone, so they are kept with the fleet like region_sets."""
    kept = f.fill_links
    n_reg = len(f.regions)
    out = []
    for key in sets:
        got = kept.get(key)
        if got is None:
            idx = np.flatnonzero((key >> np.arange(n_reg, dtype=np.int64)) & 1)
            sub = np.ix_(idx, idx)
            off = ~np.eye(len(idx), dtype=bool)
            dearest = np.zeros(n_reg)
            dearest[idx] = np.where(off, f.egress[sub], 0.0).max(axis=1, initial=0.0)
            got = (
                float(f.pair_bw[sub][off].min(initial=np.inf)),
                float(f.pair_lat[sub][off].max(initial=0.0)),
                dearest,
            )
            if len(kept) >= FILL_LINKS_KEPT:
                kept.clear()
            kept[key] = got
        out.append(got)
    return (
        np.array([g[0] for g in out]),
        np.array([g[1] for g in out]),
        np.array([g[2] for g in out]).reshape(len(out), n_reg),
    )


@dataclass(frozen=True)
class _Entries:
    """The used (row, unit) entries of a fill matrix, and what scoring reads of each row."""

    rows: np.ndarray  # per entry: its row
    units: np.ndarray  # per entry: its unit
    members: np.ndarray  # per entry: the members its replicas take, ceil(x / cap)
    t_local: np.ndarray  # per row: its slowest replica's local step
    n_part: np.ndarray  # per row: its sync participants (members)


def _entries(pr: Problem, x: np.ndarray, cols: np.ndarray, levels: np.ndarray) -> _Entries:
    """A row uses a few units out of ``cols``: its figures are read per used (row, unit) entry."""
    rows, at = np.nonzero(x)
    xs = x[rows, at]
    units = cols[at]
    t1 = pr.t1[units]
    single = (xs == 1) & (pr.lo[units] <= 1) & (t1 <= levels[rows])
    t_local = np.zeros(len(x))
    np.maximum.at(t_local, rows, np.where(single, t1, pr.t2[units]))
    # Members per unit, ceil(x / cap): in floats (exact for these small counts, and faster than
    # integer division).
    members = np.ceil(xs / np.maximum(pr.cap[units], 1)).astype(np.int64)
    n_part = np.zeros(len(x), dtype=np.int64)
    np.add.at(n_part, rows, members)
    return _Entries(rows, units, members, t_local, n_part)


def _members_by_region(
    pr: Problem, cols: np.ndarray, e: _Entries, n_rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The regions the used units lie in, ascending; each entry's index among them; and per row
    and such region, its members there (rows × regions, floats)."""
    present = np.zeros(len(pr.fleet.regions), dtype=bool)
    present[pr.region[cols]] = True
    regs = np.flatnonzero(present)
    region_of = (np.cumsum(present) - 1)[pr.region[e.units]]
    per_region = np.zeros(n_rows * len(regs), dtype=np.int64)  # rows × used regions
    np.add.at(per_region, e.rows * len(regs) + region_of, e.members)
    return regs, region_of, per_region.reshape(n_rows, len(regs)).astype(float)


def _used_set_links(
    f: Fleet, used: np.ndarray, regs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the slowest link between two of its used regions, the highest latency and the
    summed dearest egress of its regions. Rows mostly repeat a few sets of used regions, and
    candidates and quotes meet the same sets: each set's links are read once and kept with the
    fleet, then spread back to the rows."""
    if len(f.regions) <= 62:
        sets, row_set = np.unique(used @ (1 << regs.astype(np.int64)), return_inverse=True)
        bw_s, lat_s, dearest = _set_links(f, sets.tolist())
        row_set = row_set.reshape(-1)
        return bw_s[row_set], lat_s[row_set], dearest[:, regs].sum(axis=1)[row_set]
    sub = np.ix_(regs, regs)
    pair = used[:, :, None] & used[:, None, :] & ~np.eye(len(regs), dtype=bool)[None, :, :]
    bw = np.where(pair, f.pair_bw[sub][None, :, :], np.inf).min(axis=(1, 2))
    lat = np.where(pair, f.pair_lat[sub][None, :, :], 0.0).max(axis=(1, 2))
    eg = np.where(pair, f.egress[sub][None, :, :], 0.0).max(axis=2).sum(axis=1)
    return bw, lat, eg


def _exchange_s(
    pr: Problem,
    n_part: np.ndarray,
    per_region: np.ndarray,
    inside: tuple[np.ndarray, np.ndarray, np.ndarray],
    between: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, one exchange's seconds and whether it is the hierarchical one: the flat ring over
    the slowest hop inside the regions (``inside``: bytes/s, seconds, the slowest gather) and
    between them (``between``: bytes/s, seconds), or the hierarchical exchange where it is faster
    (``problem.sync_seconds_and_egress``); plus the leaders' per-parameter work."""
    f, spec = pr.fleet, pr.fleet.spec
    (in_bw, in_lat, gather), (bw, lat) = inside, between
    n_used = (per_region > 0).sum(axis=1)
    multi = n_used >= 2
    hop_bw = np.minimum(in_bw, np.where(multi, bw, np.inf))
    hop_lat = np.maximum(in_lat, np.where(multi, lat, 0.0))
    ring = n_part >= 2
    n_params = float(spec.model.n_params)
    safe_bw = np.where(ring & (hop_bw > 0) & np.isfinite(hop_bw), hop_bw, 1.0)
    t_sync = np.where(ring, cm.ring_sync_s(spec.sync, n_params, np.maximum(n_part, 2), safe_bw, hop_lat), 0.0)
    t_sync = np.where(ring & (hop_bw <= 0), np.inf, t_sync)
    largest = per_region.max(axis=1)
    can = multi & (largest >= 2) & np.isfinite(in_bw) & (in_bw > 0) & (bw > 0)
    local, wan = cm.hierarchical_parts(
        spec.sync, n_params, np.where(can, n_used, 2), gather, np.where(can, bw, 1.0), np.where(can, lat, 0.0)
    )
    hier = can & cm.hierarchical_pays(spec.sync, n_used, largest, t_sync, local + wan)
    t_sync = np.where(hier, local + wan, t_sync)
    return t_sync + np.where(ring, f.wan_param_s, 0.0), hier  # the leaders' per-parameter work


def _score(pr: Problem, x: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(step seconds, cost) of every fill row with packed members, as evaluate() would score them."""
    f = pr.fleet
    spec = f.spec
    cols = np.flatnonzero(x.any(axis=0))  # only the units some row uses
    x = x[:, cols]
    e = _entries(pr, x, cols, levels)
    regs, region_of, per_region = _members_by_region(pr, cols, e, len(x))
    used = per_region > 0
    n_used = used.sum(axis=1)
    inside = _in_region_hops(f, e.rows, e.units, e.members, regs, region_of, per_region)
    bw, lat, eg = _used_set_links(f, used, regs)
    t_sync, hier = _exchange_s(pr, e.n_part, per_region, inside, (bw, lat))
    step, final = runtime_step(pr, e.t_local, t_sync, e.n_part)
    n_params = float(spec.model.n_params)
    per = np.where(
        hier,
        cm.wan_bytes_per_leader(spec.sync, n_params, n_used),
        cm.wan_bytes_per_leader(spec.sync, n_params, e.n_part),
    )
    steps = spec.training.steps
    rate = (x * pr.price[cols][None, :]).sum(axis=1) * pr.dev  # over cols, as before: float sums
    duration = steps * step + final + f.fixed_s
    cost = duration * rate / 3600.0 + steps * pr.xps * np.where(n_used >= 2, per / cm.GB * eg, 0.0)
    return duration / steps, cost


@functools.cache
def _row_weights(n: int) -> np.ndarray:
    """Fixed random weights that tell distinct fill rows apart (one weighted sum per row)."""
    w = np.random.default_rng(0).random(n)
    w.flags.writeable = False
    return w


def _eligible(pr: Problem, levels: np.ndarray, t1_ok: np.ndarray, t2_ok: np.ndarray) -> np.ndarray:
    """Per level τ and unit, the replicas it admits: every slot where its shared step is at most
    τ, else one per member where its step alone is."""
    tau = levels[:, None]
    full = np.where(t2_ok, pr.count * pr.cap, 0)
    singles = np.where(t1_ok, pr.count, 0)
    elig = np.where(
        pr.t2[None, :] <= tau, full[None, :], np.where(pr.t1[None, :] <= tau, singles[None, :], 0)
    )
    return elig.astype(np.int64, copy=False)


def _grown_sets(pr: Problem, elig: np.ndarray) -> dict[bytes, np.ndarray]:
    """Region sets grown for a few levels: what is compact at a slow level (all device kinds)
    differs from what is compact when only the fastest units are admitted."""
    feasible = np.flatnonzero(elig.sum(axis=1) >= pr.deg.dp)
    sets: dict[bytes, np.ndarray] = {}
    if len(feasible):
        for q in SET_LEVELS:
            li = int(feasible[min(len(feasible) - 1, int(q * (len(feasible) - 1)))])
            for regions in _region_sets(pr, elig[li]):
                sets.setdefault(regions.tobytes(), regions)
    return sets


def _fills(
    pr: Problem, elig: np.ndarray, levels: np.ndarray, sets: dict[bytes, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Every (set, order, level) fill, one row each (replica counts per unit), and each row's
    level; None where no set can hold dp at any level. Two fill orders: cheapest first, and
    largest members first (fewest sync participants, what per-step synchronisation rewards)."""
    dp = pr.deg.dp
    # lexsort is stable: ties keep the units' order.
    order = np.lexsort((pr.t2, pr.price))
    big_first = np.lexsort((pr.price, -pr.cap))
    # Per order, the eligible counts and the units' regions in that order, gathered once.
    by_order = [(ordr, elig[:, ordr], pr.region[ordr]) for ordr in (order, big_first)]
    pieces: list[tuple[np.ndarray, np.ndarray]] = []  # (units, fills) per (set, order)
    row_level, n_rows = [], 0
    n_lv = len(levels)
    for regions in sets.values():
        # Both orders' fills of the set at once: the first n_lv rows cheapest first, the others
        # largest first (each order restricted to the set's units).
        inside = [regions[reg_o] for _, _, reg_o in by_order]
        el = np.concatenate([el_o[:, m] for (_, el_o, _), m in zip(by_order, inside, strict=True)])
        if not el.shape[1]:
            continue
        cum = np.cumsum(el, axis=1)
        good = cum[:n_lv, -1] >= dp  # a level whose set can hold dp fills it exactly (either order)
        n_good = int(np.count_nonzero(good))
        if not n_good:
            continue
        lv = levels
        if n_good < n_lv:
            keep = np.concatenate([good, good])
            el, cum, lv = el[keep], cum[keep], levels[good]
        take = np.minimum(np.maximum(dp - (cum - el), 0), el)  # np.clip, without its wrapper
        for k, ((ordr, _, _), m) in enumerate(zip(by_order, inside, strict=True)):
            pieces.append((ordr[m], take[k * n_good : (k + 1) * n_good]))
            row_level.append(lv)
        n_rows += len(take)
    if not n_rows:
        return None
    # The fills, one row each (replica counts: 32 bits hold them, and halve what the passes
    # over rows × units below read).
    x = np.zeros((n_rows, pr.n_units), dtype=np.int32)
    at = 0
    for cols, take in pieces:
        x[at : at + len(take), cols] = take
        at += len(take)
    return x, np.concatenate(row_level)


def _picks(step: np.ndarray, cost: np.ndarray) -> list[int]:
    """The best rows for cost, for time and for their balance, ``ROWS_PER_GOAL`` each."""
    balance = step / step.min() + cost / cost.min()
    picks: list[int] = []
    for goal in (cost, step, balance):
        for i in np.argsort(goal, kind="stable")[:ROWS_PER_GOAL]:
            if int(i) not in picks:
                picks.append(int(i))
    return picks


def candidate_solutions(pr: Problem) -> list[Solution]:
    """A handful of good solutions over the levels and region sets above (possibly none)."""
    ok = pr.usable
    if pr.capacity() < pr.deg.dp:
        return []
    t1_ok = ok & (pr.lo <= 1)
    t2_ok = ok & (pr.cap >= 2)
    levels = _levels(pr, t1_ok, t2_ok)
    elig = _eligible(pr, levels, t1_ok, t2_ok)
    filled = _fills(pr, elig, levels, _grown_sets(pr, elig))
    if filled is None:
        return []
    x, lv = filled
    # Many levels and sets give the same fill: score each distinct one once (lowest level kept).
    key = (x * _row_weights(pr.n_units)[None, :]).sum(axis=1)
    _, first = np.unique(np.round(key, 6), return_index=True)
    x, lv = x[first], lv[first]
    step, cost = _score(pr, x, lv)
    finite = np.isfinite(step)
    if not finite.any():
        return []
    x, lv, step, cost = x[finite], lv[finite], step[finite], cost[finite]
    out: dict[Solution, None] = {}
    for i in _picks(step, cost):
        for sol in _to_solutions(pr, _Row(pr, x[i]), float(lv[i])):
            out[sol] = None
    return list(out)


class _Row:
    """A fill row's used units and their per-unit figures as plain Python numbers (read once for
    both member splits)."""

    def __init__(self, pr: Problem, row: np.ndarray) -> None:
        used = np.flatnonzero(row)
        self.used = used.tolist()
        self.xs, self.lo = row[used].tolist(), pr.lo[used].tolist()
        self.t1, self.t2 = pr.t1[used].tolist(), pr.t2[used].tolist()
        self.count, self.cap = pr.count[used].tolist(), pr.cap[used].tolist()


def _to_solutions(pr: Problem, row: _Row, level: float) -> list[Solution]:
    """The row's solutions: its members packed (``split``), then spread where that differs; a
    split that breaks a rule gives none."""
    n1 = [0] * pr.n_units
    n2 = [0] * pr.n_units
    x2 = [0] * pr.n_units
    packed_ok = spread_ok = True
    moved: list[tuple[int, tuple[int, int, int]]] = []  # (unit, spread split) where the two differ
    # Plain Python numbers: this loop runs per picked row, per unit used.
    xs, lo, t1, t2, count, cap = row.xs, row.lo, row.t1, row.t2, row.count, row.cap
    for k, u in enumerate(row.used):
        x = xs[k]  # ≥ 1: the row uses the unit
        single_ok = lo[k] <= 1 and t1[k] <= level
        alone = (x, 0, 0) if single_ok and x <= count[k] else None  # one replica per member
        if t2[k] > level:
            # Only one replica per member is fast enough here.
            got = wide = alone
        else:
            got = split(x, count[k], cap[k], lo[k], single_ok, False)
            wide = alone or got  # split(..., spread=True)
        if got is None:
            packed_ok = False
        else:
            n1[u], n2[u], x2[u] = got
        if wide is None:
            spread_ok = False
        elif wide != got:
            moved.append((u, wide))
    units = tuple(row.used)
    out = [Solution(tuple(n1), tuple(n2), tuple(x2), units=units)] if packed_ok else []
    if spread_ok and moved:
        for u, (a, b, c) in moved:
            n1[u], n2[u], x2[u] = a, b, c
        out.append(Solution(tuple(n1), tuple(n2), tuple(x2), units=units))
    return out
