"""Work balancing for round-based sync (local SGD, DiLoCo): how many inner steps each region runs
in a round so that all regions reach the round's end together.

Pure functions of data every region holds identically (the figures carried in one round's
messages), so every region computes the same split with no extra round trip. With heterogeneous
regions (an A100 region beside an H100 one) fixed H makes the fast region wait for the slow one at
every round; here each region's steps follow its speed, and the job's total stays the fixed plan's.
"""

from __future__ import annotations

import math

MAX_STEP_S = 3600.0  # a step time above an hour is no measurement (bounds what a peer may send)


def split_round(
    arrive: dict[str, float], step_s: dict[str, float], total: int, least: int = 1
) -> dict[str, int]:
    """Inner steps per region for one round: they sum to exactly ``total``, each is >= ``least``
    (>= 1), and the regions' predicted ends ``arrive[r] + steps[r] * step_s[r]`` are as equal as
    integers allow.

    ``arrive``: when each region is predicted to start the round (any common clock; only the
    differences matter); ``step_s``: its seconds per step. A region missing a usable figure (not
    finite, not > 0) makes the split even (``total`` must then be a multiple of the regions).
    Ties break by region name, so the result is the same wherever it is computed.
    """
    regions = sorted(step_s)
    n = len(regions)
    least = max(1, least)
    if n == 0 or total < n * least:
        raise ValueError(f"cannot split {total} steps over {n} regions with at least {least} each")
    usable = all(
        r in arrive and math.isfinite(arrive[r]) and math.isfinite(step_s[r]) and 0 < step_s[r] <= MAX_STEP_S
        for r in regions
    )
    if not usable:
        base, extra = divmod(total, n)
        return {r: base + (1 if i < extra else 0) for i, r in enumerate(regions)}
    t0 = min(arrive[r] for r in regions)
    a = {r: arrive[r] - t0 for r in regions}
    # Water-filling: the common end E with sum (E - a_r) / s_r = total over the regions that get
    # more than ``least`` steps; a region that would get less (it starts too late) is held there.
    pinned: set[str] = set()
    ideal: dict[str, float] = {}
    while True:
        free = [r for r in regions if r not in pinned]
        budget = total - least * len(pinned)
        inv = sum(1.0 / step_s[r] for r in free)
        end = (budget + sum(a[r] / step_s[r] for r in free)) / inv
        ideal = {r: (end - a[r]) / step_s[r] for r in free}
        low = [r for r in free if ideal[r] < least]
        if not low or len(free) == len(low):
            break
        pinned.update(low)
    out = {r: least for r in pinned} | {r: max(least, math.floor(ideal[r])) for r in ideal}
    left = total - sum(out.values())
    # Largest remainder first (the region whose ideal share is most cut off), then by name.
    order = sorted(ideal, key=lambda r: (-(ideal[r] - math.floor(ideal[r])), r))
    i = 0
    while left > 0:
        out[order[i % len(order)]] += 1
        left -= 1
        i += 1
    while left < 0:  # clamps to ``least`` gave too much: take from the region that would end last
        r = max((r for r in regions if out[r] > least), key=lambda r: (a[r] + out[r] * step_s[r], r))
        out[r] -= 1
        left += 1
    return out
