"""Screen every candidate at once: memory, capacity and lower bounds, one layout at a time.

Candidates with the same (tp, pp, zero) share their units; their step times are affine in the
micro-batches per replica and their memory floors differ only through it, so a whole column of
dp values is evaluated with a handful of array operations. Problems are then built only for the
candidates the search actually solves.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from control_layer.planner import cost_model as cm
from control_layer.planner.bounds import Rows, lower_bounds_rows, make_rows, sort_spans
from control_layer.planner.candidates import Degrees
from control_layer.planner.local_step import n_micro_batches
from control_layer.planner.problem import Fleet, fewest_replicas, layout, memory_by_replicas


@dataclass(frozen=True)
class Screened:
    deg: Degrees
    status: str  # "ok" | "memory" | "capacity" | "same" (a ZeRO stage that changes nothing)
    lb: tuple[float, float] = (math.inf, math.inf)  # quick (duration s, cost USD) lower bounds
    capacity: int = 0  # replicas the fleet can host at these degrees
    need_gb: float = 0.0  # per-device memory with the widest sharding (for the explanation)
    have_gb: float = 0.0  # usable memory of the largest device


def _memory_floors(
    fleet: Fleet, tp: int, pp: int, zero: int, dps: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per dp: the fewest replicas per member for memory to fit, per unit (cap + 1 when never);
    and the per-device need with the widest sharding the fleet allows (for explanations)."""
    spec = fleet.spec
    lay = layout(fleet, tp, pp)
    usable_bytes = cm.USABLE_MEMORY_FRACTION * lay.memory * cm.GB
    most = max(1, int(lay.cap.max()) if len(lay.cap) else 1)
    lo, need = [], []
    seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for dp in dps:
        mi = n_micro_batches(spec, dp)
        # dp only matters through the micro-batches a replica steps on.
        if mi not in seen:
            by_r = memory_by_replicas(spec, Degrees(dp, tp, pp, zero), mi, most)
            seen[mi] = (np.minimum(fewest_replicas(by_r, usable_bytes, lay.cap), lay.cap + 1), by_r)
        lo.append(seen[mi][0])
        need.append(seen[mi][1][min(most, dp) - 1])
    return np.array(lo).reshape(len(dps), len(lay.units)), np.array(need)


def _times(fleet: Fleet, tp: int, pp: int, zero: int, dps: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(t1, t2) per dp and unit. Step times are affine in the micro-batches per replica: one
    evaluation covers every dp."""
    spec = fleet.spec
    lay = layout(fleet, tp, pp)
    m = np.array([n_micro_batches(spec, dp) for dp in dps], dtype=float)
    args = (lay.flops, lay.intra_bw, lay.intra_lat, lay.pp_bw, lay.pp_lat)
    shape = (len(dps), len(lay.units))
    sched = spec.pp_schedule  # the job's, as ``problem.build_problem`` prices it
    # Alone, and two replicas on a node: the smallest gradient ring, so the screen's bounds stay bounds.
    t1, t2 = cm.replica_totals(spec, tp, pp, zero, m[:, None], (1, 2), *args, schedule=sched)
    return np.broadcast_to(t1, shape).astype(float), np.broadcast_to(t2, shape).astype(float)


class Bounds:
    """Full lower bounds, computed a layout at a time and only when first asked for; once the
    search has named the candidates it may ask about (``ask_only``), only their rows, and of
    those the ones it says it is likely to ask about next (a row's bound does not depend on
    which others are computed with it; the rest are computed if and when asked)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int], tuple[Rows, list[Degrees]]] = {}
        self._full: dict[Degrees, tuple[float, float]] = {}
        self._asked: set[Degrees] | None = None
        self._spans: dict[tuple[int, int], tuple[float, float]] = {}

    def add(self, key: tuple[int, int], rows: Rows, degs: list[Degrees]) -> None:
        self._rows[key] = (rows, degs)

    def ask_only(self, degs: set[Degrees]) -> None:
        """The candidates whose full bounds may be asked for (the others' rows are skipped)."""
        self._asked = degs

    def full(self, deg: Degrees, likely: Callable[[Degrees], bool] | None = None) -> tuple[float, float]:
        """deg's full bound. likely: which other candidates the search may ask about soon (their
        rows are computed with deg's); every asked-for candidate of the layout when not given."""
        got = self._full.get(deg)
        if got is not None:
            return got
        key = (deg.tp, deg.pp)
        rows, degs = self._rows[key]
        if self._asked is None:
            t, c = lower_bounds_rows(rows)
            self._full.update({d: (float(t[i]), float(c[i])) for i, d in enumerate(degs)})
            return self._full[deg]
        pick = [
            i
            for i, d in enumerate(degs)
            if d == deg or (d in self._asked and d not in self._full and (likely is None or likely(d)))
        ]
        spans = self._spans.get(key)
        if spans is None:
            spans = self._spans[key] = sort_spans(rows)
        t, c = lower_bounds_rows(rows, only=np.array(pick), spans=spans)
        self._full.update({degs[i]: (float(t[j]), float(c[j])) for j, i in enumerate(pick)})
        return self._full[deg]


def screen(fleet: Fleet, degrees: list[Degrees], pinned_zero: bool) -> tuple[list[Screened], Bounds]:
    """One verdict per candidate, in the order given, with quick bounds; and the full bounds."""
    bounds = Bounds()
    groups: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for d in degrees:
        groups[(d.tp, d.pp)][d.zero].append(d.dp)
    verdict: dict[Degrees, Screened] = {}
    have = float(fleet.cls_memory.max()) * cm.USABLE_MEMORY_FRACTION if len(fleet.cls_memory) else 0.0
    for (tp, pp), by_zero in groups.items():
        lower: dict[int, np.ndarray] = {}  # dp -> memory floor at the last stage kept
        degs: list[Degrees] = []
        needs: list[float] = []
        los, t1s, t2s = [], [], []
        for zero in sorted(by_zero):
            dps = sorted(by_zero[zero])
            if not pinned_zero and zero == 1:
                # ZeRO-1 and -2 cost the same time and -2 saves more memory: -1 is never better.
                for dp in dps:
                    verdict[Degrees(dp, tp, pp, 1)] = Screened(Degrees(dp, tp, pp, 1), "same")
                continue
            lo, need = _memory_floors(fleet, tp, pp, zero, dps)
            keep = []
            for i, dp in enumerate(dps):
                prev = lower.get(dp)
                if not pinned_zero and prev is not None and np.array_equal(prev, lo[i]):
                    # A higher stage that lets no unit hold fewer replicas only adds communication.
                    verdict[Degrees(dp, tp, pp, zero)] = Screened(Degrees(dp, tp, pp, zero), "same")
                else:
                    lower[dp] = lo[i]
                    keep.append(i)
            if keep:
                t1, t2 = _times(fleet, tp, pp, zero, [dps[i] for i in keep])
                degs += [Degrees(dps[i], tp, pp, zero) for i in keep]
                needs += [float(need[i]) for i in keep]
                los.append(lo[keep])
                t1s.append(t1)
                t2s.append(t2)
        if not degs:
            continue
        # Every kept (zero, dp) of this layout is one row of the same arrays.
        lay = layout(fleet, tp, pp)
        rows = make_rows(
            fleet,
            np.array([d.dp for d in degs]),
            tp * pp,
            np.concatenate(t1s),
            np.concatenate(t2s),
            np.concatenate(los),
            lay.count,
            lay.cap,
            lay.price,
            lay.region,
            lay.speed_groups,
        )
        capacity = rows.room_all.sum(axis=1)
        # Quick bounds only where the fleet has room for dp replicas (rows are independent).
        fits = np.flatnonzero(capacity >= rows.dp)
        lb_t, lb_c = lower_bounds_rows(rows, quick=True, only=fits) if len(fits) else ([], [])
        at = {int(j): k for k, j in enumerate(fits)}
        bounds.add((tp, pp), rows, degs)
        for j, deg in enumerate(degs):
            if capacity[j] < 1:
                verdict[deg] = Screened(deg, "memory", need_gb=needs[j] / cm.GB, have_gb=have)
            elif capacity[j] < deg.dp:
                verdict[deg] = Screened(deg, "capacity", capacity=int(capacity[j]))
            else:
                k = at[j]
                verdict[deg] = Screened(deg, "ok", (float(lb_t[k]), float(lb_c[k])), int(capacity[j]))
    return [verdict[d] for d in degrees], bounds
