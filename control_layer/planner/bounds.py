"""Lower bounds on a candidate's duration and cost, cheap enough to rank and prune candidates.

A candidate whose bound point (duration, cost) cannot improve the fastest or the cheapest option
found so far is never solved. Bounds are computed for many candidates at once: every candidate
with the same (tp, pp, zero) shares its units, and differs only in dp (so in micro-batches per
replica, step times and memory), which becomes the row of 2-D arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from control_layer.planner import cost_model as cm
from control_layer.planner.gather import take_rows
from control_layer.planner.problem import Fleet, Problem, local_share


@dataclass(frozen=True)
class Rows:
    """Candidates sharing one layout, one row per dp, over groups of units with equal step times
    and price (a bound only needs how many replica slots each group offers, not which member).
    """

    fleet: Fleet
    dp: np.ndarray  # (D,)
    devices_per_replica: int
    t1: np.ndarray  # (D, G) step alone on a member
    t2: np.ndarray  # (D, G) step sharing a member
    # (D, G) what t1 and t2 hold beyond the local step itself: checkpoint writes and the run's
    # fixed seconds per step (``local_share``), which an overlapped exchange does not hide behind.
    e1: np.ndarray
    e2: np.ndarray
    n_single: np.ndarray  # (D, G) members that can hold exactly one replica
    n_multi: np.ndarray  # (D, G) replica slots on members that can hold two or more
    price: np.ndarray  # (G,)
    g_region: np.ndarray  # (G,) every group lies in one region
    z_time: np.ndarray  # (D,) fastest step of one member holding every replica (inf if none can)
    z_rate: np.ndarray  # (D,) least Σ price × step of such a member, per replica-second
    room_all: np.ndarray  # (D, R) replicas each region can hold
    room_one: np.ndarray  # (D, R) replicas the largest member of each region can hold
    p_min: np.ndarray  # (D,) fewest members (sync participants) that can hold dp replicas
    p_region: np.ndarray  # (D, R) the same within each region alone (inf where it cannot)

    def select(self, idx: np.ndarray) -> Rows:
        """These rows only (every figure of a row depends on that row alone)."""
        return replace(
            self,
            dp=self.dp[idx],
            t1=self.t1[idx],
            t2=self.t2[idx],
            e1=self.e1[idx],
            e2=self.e2[idx],
            n_single=self.n_single[idx],
            n_multi=self.n_multi[idx],
            z_time=self.z_time[idx],
            z_rate=self.z_rate[idx],
            room_all=self.room_all[idx],
            room_one=self.room_one[idx],
            p_min=self.p_min[idx],
            p_region=self.p_region[idx],
        )


def sum_by(x: np.ndarray, key: np.ndarray, n: int) -> np.ndarray:
    """Per row of x (D×U), sums over columns with equal key (U,) into n bins: D×n.

    (bincount, not a matrix product: a multithreaded BLAS stalls on a busy two-core machine.)
    """
    d = x.shape[0]
    idx = (np.arange(d)[:, None] * n + key[None, :]).ravel()
    return np.bincount(idx, weights=x.ravel().astype(float), minlength=d * n).reshape(d, n)


def make_rows(
    fleet: Fleet,
    dp: np.ndarray,
    devices_per_replica: int,
    t1: np.ndarray,
    t2: np.ndarray,
    lo: np.ndarray,
    count: np.ndarray,
    cap: np.ndarray,
    price: np.ndarray,
    region: np.ndarray,
    group: np.ndarray | None = None,
) -> Rows:
    """Rows from per-unit arrays (t1, t2, lo: D×U); group maps units to groups of equal t and price.

    Step times gain the checkpoint writes the runtime would make at that step and the run's
    fixed seconds per step (``local_share``): both rise with the step, so the bounds taken over
    them below stay bounds.
    """
    t1, e1 = _with_share(fleet, t1)
    t2, e2 = _with_share(fleet, t2)
    n_u = len(count)
    if group is None:
        group = np.arange(n_u)
    n_g = int(group.max()) + 1 if n_u else 0
    usable = (lo <= np.minimum(cap[None, :], dp[:, None])) & (cap >= 1)[None, :] & (count >= 1)[None, :]
    first = np.zeros(n_g, dtype=int)
    first[group[::-1]] = np.arange(n_u)[::-1]
    n_single = sum_by(np.where(usable & (lo <= 1), count[None, :], 0), group, n_g)
    n_multi = sum_by(np.where(usable & (cap >= 2)[None, :], (count * cap)[None, :], 0), group, n_g)
    n_reg = len(fleet.regions)
    member_cap = np.where(usable, cap[None, :], 0)
    room_one = np.zeros((len(dp), n_reg))
    if n_u:  # the largest member per region: one max per run of a region's units
        by_reg = np.argsort(region, kind="stable")
        regs, starts = np.unique(region[by_reg], return_index=True)
        room_one[:, regs] = np.maximum.reduceat(member_cap[:, by_reg], starts, axis=1)
    # One member holding all dp replicas: alone (t1) when dp = 1, sharing (t2) otherwise.
    holds = usable & (member_cap >= dp[:, None]) & (lo <= dp[:, None])
    t_one = np.where((dp == 1)[:, None], t1, t2)
    z_time = np.where(holds, t_one, np.inf).min(axis=1, initial=np.inf)
    z_rate = np.where(holds, t_one * price[None, :], np.inf).min(axis=1, initial=np.inf) * dp
    return Rows(
        fleet=fleet,
        dp=dp,
        devices_per_replica=devices_per_replica,
        t1=t1[:, first],
        t2=t2[:, first],
        e1=e1[:, first],
        e2=e2[:, first],
        n_single=n_single,
        n_multi=n_multi,
        price=price[first],
        g_region=region[first],
        z_time=z_time,
        z_rate=z_rate,
        room_all=sum_by(member_cap * count[None, :], region, n_reg),
        room_one=room_one,
        p_min=fewest_members(cap, usable, count, dp),
        p_region=fewest_members_by_region(cap, usable, count, dp, region, n_reg),
    )


def _with_share(fleet: Fleet, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(t with ``local_share``'s per-step extras, those extras)."""
    full = local_share(fleet, t)
    return full, full - t


def fewest_members(cap: np.ndarray, usable: np.ndarray, count: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Per row, the fewest members that hold dp replicas between them, largest first (inf where
    all of them cannot): every placement has at least that many sync participants. cap, count:
    per unit; usable: per row and unit (an unusable unit holds none)."""
    d, n_u = usable.shape
    if n_u == 0:
        return np.full(d, np.inf)
    order = np.argsort(-cap, kind="stable")  # one order for every row: unusable units add nothing
    held = np.where(usable[:, order], cap[order], 0).astype(float)
    members = np.where(held > 0, count[order], 0).astype(float)
    room = np.cumsum(held * members, axis=1)
    before_room = room - held * members
    before = np.cumsum(members, axis=1) - members
    at = np.minimum((room < dp[:, None]).sum(axis=1), n_u - 1)  # the unit where dp is reached
    rows = np.arange(d)
    need = before[rows, at] + np.ceil((dp - before_room[rows, at]) / np.maximum(held[rows, at], 1.0))
    return np.where(room[:, -1] >= dp, need, np.inf)


def fewest_members_by_region(
    cap: np.ndarray, usable: np.ndarray, count: np.ndarray, dp: np.ndarray, region: np.ndarray, n_reg: int
) -> np.ndarray:
    """``fewest_members`` within each region alone: (D, R), inf where a region cannot hold dp.
    Units sorted by region, then largest first; each region's run of units is filled apart."""
    d, n_u = usable.shape
    out = np.full((d, n_reg), np.inf)
    if n_u == 0:
        return out
    order = np.lexsort((-cap, region))
    held = np.where(usable[:, order], cap[order], 0).astype(float)
    members = np.where(held > 0, count[order], 0).astype(float)
    regs, starts = np.unique(region[order], return_index=True)
    seg_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n_u)))
    room_cum = np.cumsum(held * members, axis=1)
    mem_cum = np.cumsum(members, axis=1)
    # Cumulative sums restarted at each region's first unit.
    room_base = (room_cum - held * members)[:, starts][:, seg_of]
    mem_base = (mem_cum - members)[:, starts][:, seg_of]
    room = room_cum - room_base
    before_room = room - held * members
    before = mem_cum - mem_base - members
    # Per unit: the members a region needs when dp is reached at this unit (inf elsewhere).
    reached = (room >= dp[:, None]) & (before_room < dp[:, None])
    need = before + np.ceil((dp[:, None] - before_room) / np.maximum(held, 1.0))
    per_unit = np.where(reached, need, np.inf)
    out[:, regs] = np.minimum.reduceat(per_unit, starts, axis=1)
    return out


def rows_of(pr: Problem) -> Rows:
    return make_rows(
        pr.fleet,
        np.array([pr.deg.dp]),
        pr.dev,
        pr.t1[None, :],
        pr.t2[None, :],
        pr.lo[None, :],
        pr.count,
        pr.cap,
        pr.price,
        pr.region,
    )


def _fill(n: np.ndarray, w: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Per row, the cheapest total weight of dp slots, with n[i] slots of weight w[i]."""
    order = np.argsort(w, axis=1, kind="stable")
    n_s = take_rows(n, order)
    w_s = take_rows(w, order)
    before = np.cumsum(n_s, axis=1) - n_s
    take = np.clip(dp[:, None] - before, 0, n_s)
    total = (take * np.where(take > 0, w_s, 0.0)).sum(axis=1)  # no inf × 0
    return np.where(take.sum(axis=1) >= dp, total, math.inf)


def _dp_th(n: np.ndarray, t: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Per row, the dp-th smallest slot time, with n[i] slots of time t[i]."""
    order = np.argsort(t, axis=1, kind="stable")
    cum = np.cumsum(take_rows(n, order), axis=1)
    reach = (cum < dp[:, None]).sum(axis=1)
    inside = reach < t.shape[1]
    rows = np.arange(len(dp))
    return np.where(inside, t[rows, order[rows, np.minimum(reach, t.shape[1] - 1)]], math.inf)


def _link_orders(f: Fleet) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]], float]:
    """The region links as the WAN floor reads them: which pairs are linked; per region, its
    links fastest first and lowest latency first (order, values, finite); the cheapest egress.
    They follow from the region pairs alone: built once, kept with the fleet."""
    got = f.wan_orders.get("links")
    if got is None:
        linked = ~np.eye(len(f.regions), dtype=bool) & (f.pair_bw > 0)
        links = []
        for values, high in ((f.pair_bw, True), (f.pair_lat, False)):
            vals = np.where(linked, values, -np.inf if high else np.inf)
            order = np.argsort(-vals if high else vals, axis=1, kind="stable")  # (R, R)
            ranked = np.take_along_axis(vals, order, axis=1)
            links.append((order, ranked, np.isfinite(ranked)))
        got = f.wan_orders["links"] = (linked, links, float(np.where(linked, f.egress, np.inf).min()))
    return got  # type: ignore[return-value]


def _wan_links(rows: Rows, room: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, (bandwidth, latency, k) bounding the links of any region set with room for dp.

    k is the fewest regions whose room adds up to dp (at least 2). Any such set S, of k regions
    or more, contains some region a, and S's slowest link is no faster than the link at which a's
    fastest links first reach k−1 partners and room for dp (likewise for latency); bandwidth 0
    where no set can hold dp.
    """
    f = rows.fleet
    dp = rows.dp
    n_reg = len(f.regions)
    k = np.maximum(2, (np.cumsum(-np.sort(-room, axis=1), axis=1) < dp[:, None]).sum(axis=1) + 1)
    _, links, _ = _link_orders(f)
    out = []
    for (order, ranked, finite), high in zip(links, (True, False), strict=True):
        fill = -np.inf if high else np.inf
        reach = room[:, :, None] + np.cumsum(room[:, order], axis=2)  # (D, R, R)
        ok = (
            finite[None, :, :]
            & (reach >= dp[:, None, None])
            & (np.arange(n_reg)[None, None, :] >= (k - 2)[:, None, None])
        )
        first = np.argmax(ok, axis=2)
        best = np.where(ok.any(axis=2), ranked[np.arange(n_reg)[None, :], first], fill)  # (D, R)
        out.append(best.max(axis=1) if high else best.min(axis=1))
    bw, lat = out
    feasible = (k <= n_reg) & np.isfinite(bw) & (bw > 0)
    return np.where(feasible, bw, 0.0), lat, np.minimum(k, n_reg)


def in_region_hop(f: Fleet, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes/s, s) bounding the slowest hop among ``members`` participants of each region (last
    axis): its fastest hop, or its local link when they outnumber every cluster there (they span
    two clusters or more; ``problem.sync_seconds_and_egress``). Both fall as members rise."""
    spans = members > f.cluster_members
    return np.where(spans, f.local_bw, f.hop_bw), np.where(spans, f.local_lat, f.hop_lat)


def _hierarchical_floor(rows: Rows, bw: np.ndarray, lat: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per row, the least seconds of a hierarchical exchange (``cm.hierarchical_parts``) over G ≥ k
    regions whose links are bounded by (bw, lat): the WAN ring among G heads, and the largest
    region's gather and answer, that region holding ceil(P/G) ≥ 2 participants of P ≥ p_min, over
    its in-region hop (``in_region_hop``) at best, whichever region it is."""
    f = rows.fleet
    sync, n = f.spec.sync, float(f.spec.model.n_params)
    g = np.arange(2, len(f.regions) + 1, dtype=float)[None, :]  # (1, G)
    members = np.maximum(2.0, np.ceil(np.minimum(rows.p_min, 1e9)[:, None] / g))
    hop_bw, hop_lat = in_region_hop(f, members[:, :, None])  # (D, G, R)
    usable = hop_bw > 0  # a region whose members have no hop between them holds none of the set
    each = cm.region_gather_s(sync, n, members[:, :, None], np.where(usable, hop_bw, 1.0), hop_lat)
    gather = np.where(usable, each, math.inf).min(axis=2)
    local, wan = cm.hierarchical_parts(sync, n, g, gather, np.where(bw > 0, bw, 1.0)[:, None], lat[:, None])
    t = np.where(g >= k[:, None], local + wan, math.inf)
    return t.min(axis=1, initial=math.inf)


def wan_floor(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """Per row, (seconds, USD) one exchange costs at least when the replicas span ≥ 2 regions: the
    flat ring (``problem.sync_seconds_and_egress``) over P participants, P at least the fewest
    members that hold dp and at least k, over links bounded by ``_wan_links`` (whether each
    region holds one participant, room counted from its largest member, or several, room counted
    from all; the ring's time rises with P); or, in the dense modes, the hierarchical exchange
    (``_hierarchical_floor``), whichever is less. Each of the k regions pays at least the
    cheapest egress on offer for a participant's bytes (P's where the ring is flat, k's where
    it may be hierarchical)."""
    f = rows.fleet
    n_reg = len(f.regions)
    d = len(rows.dp)
    if n_reg < 2:
        return np.full(d, math.inf), np.full(d, math.inf)
    sync, n = f.spec.sync, float(f.spec.model.n_params)
    _, _, cheapest = _link_orders(f)
    dense = sync.mode in cm.HIERARCHICAL_MODES
    t_out, e_out = np.full(d, math.inf), np.full(d, math.inf)
    for room in (rows.room_one, rows.room_all):
        bw, lat, k = _wan_links(rows, room)
        ok = bw > 0
        p = np.maximum(k, np.minimum(rows.p_min, 1e9))
        t = cm.ring_sync_s(sync, n, p, np.where(ok, bw, 1.0), lat)
        if dense:
            t = np.minimum(t, _hierarchical_floor(rows, bw, lat, k))
        per = cm.wan_bytes_per_leader(sync, n, k if dense else p)
        t_out = np.minimum(t_out, np.where(ok, t, math.inf))
        e_out = np.minimum(e_out, np.where(ok, k * per / cm.GB * cheapest, math.inf))
    return t_out, e_out


def key_span(key: np.ndarray) -> float:
    """More than any finite key: _by_region's sort key puts each region's keys in its own span."""
    return float(np.nanmax(np.where(np.isfinite(key), key, 0.0))) + 1.0


def _by_region(
    n: np.ndarray,
    key: np.ndarray,
    g_region: np.ndarray,
    n_reg: int,
    dp: np.ndarray,
    want: str = "both",
    span: float | None = None,
    paired: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row and region: the dp-th smallest slot key, and the sum of the dp smallest keys.

    n, key: (D, S) slot counts and keys (≥ 0; a key of one row is every row's); g_region: (S,).
    Slots are sorted by region, then key (one sort per row, same region segments in every row);
    segment sums then give each region's fill. Returns two (D, R) arrays, inf where a region has
    fewer than dp slots; want "kth" or "sum" leaves the other one inf (each caller reads one),
    except that "kth" with ``paired`` (D, S) returns, second, paired's value at each kth slot.
    span: ``key_span(key)`` unless given (from the rows these were selected from, so that a
    selection sorts, and rounds, its rows as the whole would).
    """
    d, width = n.shape
    out_kth = np.full((d, n_reg), np.inf)
    out_sum = np.full((d, n_reg), np.inf)
    if width == 0:
        return out_kth, out_sum
    if span is None:
        span = key_span(key)
    composite = np.where(np.isfinite(key), key, span - 0.5) + g_region[None, :] * span
    own = np.argsort(composite, axis=1, kind="stable")
    if len(own) == 1:
        # A key with one row is every row's: one sort serves them all.
        order = np.broadcast_to(own, n.shape)
        n_s = n[:, own[0]].astype(float)
        k_s = np.broadcast_to(key[0, own[0]], n.shape)
    else:
        order = own
        n_s = take_rows(n, order).astype(float)
        k_s = take_rows(key, order)
    regions, starts = np.unique(g_region[order[0]], return_index=True)
    cum = np.cumsum(n_s, axis=1)
    base = np.concatenate([np.zeros((d, 1)), cum[:, :-1]], axis=1)[:, starts]  # before each segment
    seg_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, width)))
    seg_cum = cum - base[:, seg_of]
    have = np.add.reduceat(n_s, starts, axis=1)
    enough = have >= dp[:, None]
    if want != "kth":
        take = np.clip(dp[:, None] - (seg_cum - n_s), 0, n_s)
        total = np.add.reduceat(take * np.where(take > 0, k_s, 0.0), starts, axis=1)
        out_sum[:, regions] = np.where(enough, total, np.inf)
    if want != "sum":
        first = np.where(seg_cum >= dp[:, None], np.arange(width)[None, :], width)
        reach = np.minimum.reduceat(first, starts, axis=1)
        at = (np.arange(d)[:, None], np.minimum(reach, width - 1))
        out_kth[:, regions] = np.where(enough, k_s[at], np.inf)
        if paired is not None and want == "kth":
            out_sum[:, regions] = np.where(enough, take_rows(paired, order)[at], np.inf)
    return out_kth, out_sum


def sort_spans(rows: Rows) -> tuple[float, float]:
    """The spacing of ``_by_region``'s sort keys (time, and time × price) over all of the rows:
    a selection of them sorted with these spans sorts, and rounds, each row as the whole would."""
    t_all = np.concatenate([rows.t1, rows.t2], axis=1)
    return key_span(t_all), key_span(t_all * np.concatenate([rows.price, rows.price])[None, :])


@dataclass(frozen=True)
class _ExchangeFloor:
    """How the exchange floors a step whose local part is t. DiLoCo's runtime overlaps its
    exchange with the next steps: what does not hide behind ``delay`` steps blocks
    (``runtime_pricing``: F · max(0, T/F − delay · t) per round, delay at most a round's steps, so
    F · delay ≤ M, the fragments times their round's steps). With x exchanges per step a step is
    at least t + x · max(0, T − M·t) ≥ max(t, x·T / max(1, x·M)): below T/M the exposed part
    outweighs what t lost. Monotone in t, as the fills need."""

    hidden: bool  # DiLoCo: the exchange can hide entirely
    hide: float  # max(1, x·M)
    overlapped: bool

    @classmethod
    def of(cls, f: Fleet) -> _ExchangeFloor:
        hide = max(1.0, f.xps * f.runtime.fragments * f.runtime.round_steps)
        return cls(f.runtime.diloco, hide, f.overlapped)

    def step(self, t: np.ndarray, e: np.ndarray, sync: np.ndarray) -> np.ndarray:
        """t holds checkpoint writes and fixed seconds per step (e, ``Rows.e1``) that no exchange
        hides behind: the runtime prices the exposed part against the local step alone
        (``problem.runtime_step``), so an overlapped step is at least max(t − e, sync) + e."""
        if self.hidden:
            return np.maximum(t, sync / self.hide + e)
        return np.maximum(t, sync + e) if self.overlapped else t + sync

    @property
    def final(self) -> bool:
        """The last exchange of an overlapped run has no steps to hide behind: the run waits for
        it once (``runtime_pricing.final_sync_s``), whenever two or more participants sync."""
        return self.hidden or self.overlapped


def _quick_bounds(rows: Rows, steps: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One participant, or every slot of every region with no synchronisation: below both
    remaining cases."""
    price = np.concatenate([rows.price, rows.price])[None, :]
    n = np.concatenate([rows.n_single, rows.n_multi], axis=1)
    t = np.concatenate([rows.t1, rows.t2], axis=1)
    t_u = _dp_th(n, t, rows.dp)
    c_u = _fill(n, t * price, rows.dp) * scale
    return np.minimum(rows.z_time, t_u) * steps, np.minimum(rows.z_rate * scale, c_u)


def _one_region_bounds(
    rows: Rows, floor: _ExchangeFloor, scale: float, spans: tuple[float | None, float | None]
) -> tuple[np.ndarray, np.ndarray]:
    """All in one region r (≥ 2 participants, and at least the fewest of r's members holding
    dp): slots of r only, and the flat ring over r's fastest hop, or over its local link when
    that many members outnumber every cluster of r (they span two clusters or more;
    ``problem.sync_seconds_and_egress``). The ring's time rises with P and falls with the hop's
    speed; in one region the exchange is never hierarchical."""
    f, dp = rows.fleet, rows.dp
    steps, n_reg = f.spec.training.steps, len(f.regions)
    participants = np.maximum(2.0, np.minimum(rows.p_region, 1e9))
    hop_bw, hop_lat = in_region_hop(f, participants)
    fast = hop_bw > 0
    n_params = float(f.spec.model.n_params)
    ring_s = cm.ring_sync_s(f.spec.sync, n_params, participants, np.where(fast, hop_bw, 1.0), hop_lat)
    # (D, R); every exchange pays the leaders' work
    sync_s = f.xps * (np.where(fast, ring_s, math.inf) + f.wan_param_s)
    n = np.concatenate([rows.n_single, rows.n_multi], axis=1)
    price = np.concatenate([rows.price, rows.price])[None, :]
    t = np.concatenate([rows.t1, rows.t2], axis=1)
    g_region = np.concatenate([rows.g_region, rows.g_region])
    e = np.concatenate([rows.e1, rows.e2], axis=1)
    kth_t, kth_e = _by_region(n, t, g_region, n_reg, dp, "kth", spans[0], paired=e)
    _, sum_pt = _by_region(n, t * price, g_region, n_reg, dp, "sum", spans[1])
    _, sum_p = _by_region(n, price, g_region, n_reg, dp, "sum")
    duration = (floor.step(kth_t, kth_e, sync_s) * steps + (sync_s / f.xps if floor.final else 0.0)).min(
        axis=1
    )
    sync_cost = sync_s * sum_p / (floor.hide if floor.hidden else 1.0)
    cost = np.maximum(sum_pt, sync_cost) if f.overlapped or floor.hidden else sum_pt + sync_cost
    return duration, cost.min(axis=1) * scale


def _across_regions_bounds(rows: Rows, floor: _ExchangeFloor, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Replicas in two or more regions: the WAN floor (``wan_floor``) and any slots. Either every
    member holds one replica, or some member holds several and the step is at least the smallest
    t2 among units that can: each case is a fill of the fastest (or cheapest) slots."""
    f, dp = rows.fleet, rows.dp
    steps = f.spec.training.steps
    t_wan, egress = wan_floor(rows)
    wan = (f.xps * (t_wan + f.wan_param_s))[:, None]
    d_final = t_wan + f.wan_param_s if floor.final else 0.0
    single = floor.step(rows.t1, rows.e1, wan)
    t_s = _dp_th(rows.n_single, single, dp)
    c_s = _fill(rows.n_single, single * rows.price[None, :], dp)
    multi = rows.n_multi > 0
    # The least t2 among units that can share, with its extras (they rise with t, as t does).
    shared_t2 = np.where(multi, rows.t2, np.inf)
    least = np.argmin(shared_t2, axis=1)[:, None]
    least_t2 = np.take_along_axis(shared_t2, least, axis=1)
    least_e2 = np.take_along_axis(rows.e2, least, axis=1)
    t_m_all = floor.step(
        np.concatenate([np.maximum(rows.t1, least_t2), rows.t2], axis=1),
        np.concatenate([np.maximum(rows.e1, least_e2), rows.e2], axis=1),
        wan,
    )
    has_multi = multi.any(axis=1)
    n = np.concatenate([rows.n_single, rows.n_multi], axis=1)
    price = np.concatenate([rows.price, rows.price])[None, :]
    t_m = np.where(has_multi, _dp_th(n, t_m_all, dp), math.inf)
    c_m = np.where(has_multi, _fill(n, t_m_all * price, dp), math.inf)
    t_w = np.minimum(t_s, t_m)
    c_w = np.minimum(c_s, c_m) * scale + steps * f.xps * egress
    return t_w * steps + d_final, c_w


def lower_bounds_rows(
    rows: Rows,
    quick: bool = False,
    only: np.ndarray | None = None,
    spans: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, (duration, cost) no placement of that candidate can beat.

    The step is at least the slowest used replica's time (with its checkpoint writes) plus (or,
    when the exchange overlaps, at least) the amortised exchange, or that time alone for DiLoCo,
    whose overlapped exchange can hide entirely; the device cost at least Σ replicas × price ×
    step.
    Every placement falls in one of three cases, and the bound is the least of theirs:

    - one member (node) holds every replica: no exchange;
    - several participants, all in one region r: two of them over r's fastest hop at least
      (``Fleet.local_floor``), and only r's slots;
    - replicas in two or more regions: the WAN floor (``wan_floor``), and any slots.

    Slots are a member's first replica (time t1, alone) and its replica slots when it holds
    several (t2). With several regions, either every member holds one replica, or some member
    holds several and the step is at least the smallest t2 among units that can: each case is a
    fill of the fastest (or cheapest) slots.

    quick: a weaker, cheaper bound (one participant, or any slots anywhere with no
    synchronisation); never above the full one, so it can rule a candidate out before the full
    bound is computed.

    only: the indices of the rows wanted (the bounds of those rows, in that order); the others
    are not computed. spans: ``sort_spans(rows)``, for a caller that keeps it across selections.
    """
    if only is not None and not quick:
        # The regions' sort keys are spaced by the largest key over all rows, as for the whole.
        spans = spans if spans is not None else sort_spans(rows)
        rows = rows.select(only)
    elif only is not None:
        rows = rows.select(only)
    f = rows.fleet
    steps = f.spec.training.steps
    scale = rows.devices_per_replica * steps / 3600.0
    if quick:
        return _quick_bounds(rows, steps, scale)
    floor = _ExchangeFloor.of(f)
    d_a, c_a = _one_region_bounds(rows, floor, scale, spans if spans is not None else (None, None))
    d_w, c_w = _across_regions_bounds(rows, floor, scale)
    # One participant.
    duration = np.minimum(np.minimum(rows.z_time * steps, d_a), d_w)
    return duration, np.minimum(np.minimum(rows.z_rate * scale, c_a), c_w)


def lower_bounds(pr: Problem) -> tuple[float, float]:
    t, c = lower_bounds_rows(rows_of(pr))
    return float(t[0]), float(c[0])
