"""Why a quote came back empty: what each constraint removed, as structured reasons."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contracts.job_spec import JobSpec
from control_layer.planner.candidates import Degrees
from control_layer.planner.problem import Fleet, Score


@dataclass
class Trace:
    """What removed the candidates, for the explanation when nothing is left."""

    memory: list[tuple[Degrees, float, float]] = field(default_factory=list)  # deg, need GB, best GB
    capacity: list[tuple[Degrees, int]] = field(default_factory=list)  # deg, replicas possible
    lb_time_s: float = math.inf  # lower bounds over all viable candidates
    lb_cost: float = math.inf
    best_time_s: float = math.inf  # over all evaluated placements
    best_cost: float = math.inf
    cost_at_time_ok: float = math.inf  # cheapest among plans within max_hours
    time_at_cost_ok: float = math.inf  # fastest among plans within max_cost

    def note(self, spec: JobSpec, sc: Score) -> None:
        self.best_time_s = min(self.best_time_s, sc.duration_s)
        self.best_cost = min(self.best_cost, sc.cost)
        q = spec.qos
        if q.max_hours is None or sc.duration_s <= q.max_hours * 3600.0:
            self.cost_at_time_ok = min(self.cost_at_time_ok, sc.cost)
        if q.max_cost is None or sc.cost <= q.max_cost:
            self.time_at_cost_ok = min(self.time_at_cost_ok, sc.duration_s)


def too_few(fleet: Fleet, need: int, shape: str) -> str:
    """Why no layout fits the fleet's size, in the words of the issue."""
    mem = float(fleet.cls_memory.min())
    if len(fleet.regions) == 1:
        return f"no region in {fleet.regions} has {need} free devices with ≥ {mem:g} GB ({shape})"
    return (
        f"the regions {fleet.regions} have {fleet.n_devices} free devices with ≥ {mem:g} GB in all; "
        f"the smallest layout that fits the model ({shape}) needs {need}"
    )


def explain(spec: JobSpec, fleet: Fleet, trace: Trace) -> list[dict[str, Any]]:
    """The reasons nothing was feasible, most decisive last (its detail is the error message)."""
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
                "detail": too_few(fleet, deg.n_devices, shape) + f"; at most {have} of {deg.dp} replicas fit",
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
