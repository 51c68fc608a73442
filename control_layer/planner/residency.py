"""Resident shards: every region holding one runs at least one replica, and a region without a
shard is used only where a shard may cross to it (``data.shards``).

A resident shard is read only by tasks in its region (its bytes never cross a region boundary);
tasks in a region without a shard of their own read a non-resident shard. So with every shard
resident, the regions without one are of no use to the job; and each resident region needs a
replica, or its data would not be trained on. The search places replicas as usual, and
``cover`` moves replicas of a solution into the resident regions it left empty (the bounds the
search prunes with stay lower bounds: the constraint can only make a plan slower or dearer).
"""

from __future__ import annotations

from contracts.job_spec import JobSpec
from control_layer.planner.fleet import shard_regions
from control_layer.planner.plan_types import PlanOption, QosCheck
from control_layer.planner.problem import Problem, Solution


def resident_check(spec: JobSpec, regions: list[str]) -> QosCheck | None:
    """The option's check that each resident shard's region holds a replica (None: no shards)."""
    needed = spec.data.resident_regions
    if not spec.data.shards:
        return None
    missing = [r for r in needed if r not in regions]
    allowed = shard_regions(spec)
    stray = sorted(set(regions) - allowed) if allowed is not None else []
    detail = (
        f"a replica in each resident shard's region {list(needed)}"
        if not missing
        else f"no replica in {missing}, where resident shards live"
    )
    if stray:
        detail += f"; {stray} hold no shard and every shard is resident"
    return QosCheck(name="resident_shards", ok=not missing and not stray, detail=detail)


def with_resident_check(spec: JobSpec, option: PlanOption) -> PlanOption:
    check = resident_check(spec, option.regions)
    if check is None:
        return option
    return option.model_copy(update={"qos_checks": [*option.qos_checks, check]})


def needed_indices(spec: JobSpec, regions: list[str]) -> tuple[int, ...]:
    """Indices (in the fleet's region list) of the regions that need a replica."""
    index = {r: i for i, r in enumerate(regions)}
    return tuple(index[r] for r in spec.data.resident_regions if r in index)


def cover(pr: Problem, sol: Solution, needed: tuple[int, ...]) -> Solution | None:
    """``sol`` with a replica in each region of ``needed`` (the same dp): each empty one gets one on
    a free member of its fastest (then cheapest) unit, taken from the slowest (then dearest)
    unit of a region that keeps one; None where that cannot be done."""
    lists = pr.lists
    n = len(sol.n1)
    n1, n2, x2 = list(sol.n1), list(sol.n2), list(sol.x2)
    region = lists.region

    def held(r: int) -> int:
        return sum(n1[u] + x2[u] for u in range(n) if region[u] == r)

    missing = [r for r in needed if held(r) == 0]
    if not missing:
        return sol
    needed_set = set(needed)
    price = pr.price.tolist()
    for r in missing:
        targets = [
            u
            for u in range(n)
            if region[u] == r and lists.lo[u] <= 1 and lists.cap[u] >= 1 and n1[u] + n2[u] < lists.count[u]
        ]
        if not targets:
            return None
        target = min(targets, key=lambda u: (lists.t1[u], price[u], u))
        donors = []
        for u in range(n):
            if n1[u] + x2[u] == 0 or (region[u] in needed_set and held(region[u]) <= 1):
                continue
            if _give_one(u, n1, n2, x2, lists.lo[u], lists.cap[u], dry=True):
                donors.append(u)
        if not donors:
            return None
        donor = max(donors, key=lambda u: (lists.t1[u], price[u], -u))
        _give_one(donor, n1, n2, x2, lists.lo[donor], lists.cap[donor], dry=False)
        n1[target] += 1
    return Solution(tuple(n1), tuple(n2), tuple(x2))


def _give_one(u: int, n1: list[int], n2: list[int], x2: list[int], lo: int, cap: int, *, dry: bool) -> bool:
    """Take one replica off unit u, keeping its members' rules (``problem._shape``)."""
    low = max(2, lo)
    if n1[u] > 0:
        if not dry:
            n1[u] -= 1
        return True
    if n2[u] > 0 and x2[u] - 1 >= n2[u] * low:
        if not dry:
            x2[u] -= 1
        return True
    # A member of two becomes a member of one (where one replica alone fits its memory).
    if n2[u] > 0 and lo <= 1 and x2[u] - 2 >= (n2[u] - 1) * low and x2[u] - 2 <= (n2[u] - 1) * cap:
        if not dry:
            n2[u] -= 1
            x2[u] -= 2
            n1[u] += 1
        return True
    return False
