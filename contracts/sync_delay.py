"""How many steps an overlapped DiLoCo fragment lands after it is sent: the one rule the planner
prices placements with and a hand-built ``SyncConfig`` defaults to. Pure: numbers in, steps out."""

from __future__ import annotations

import math


def overlap_delay_steps(
    round_steps: int, exchange_s: float | None = None, step_s: float | None = None
) -> int:
    """Steps between sending a fragment and applying it: the fewest whole steps of ``step_s``
    seconds its exchange of ``exchange_s`` seconds takes, at most a round; half a round (at least
    one step) where either is unknown (None, not finite, negative, or a step of 0 seconds). The
    fewest steps is Streaming DiLoCo's small tau: the later an outer update lands, the more local
    progress it was computed without (a round applied half a round late cost ~1 % held-out loss at
    H=20; BENCHMARKS.md at dabf7f7, "Sync quality")."""
    if round_steps < 1:
        raise ValueError(f"round_steps must be >= 1, got {round_steps}")
    known = (
        exchange_s is not None
        and step_s is not None
        and math.isfinite(exchange_s)
        and exchange_s >= 0
        and math.isfinite(step_s)
        and step_s > 0
    )
    if not known:
        return max(1, round_steps // 2)
    ratio = exchange_s / step_s - 1e-9  # type: ignore[operator]
    if not math.isfinite(ratio):  # a vanishing step: the exchange needs more than a round
        return round_steps
    return min(round_steps, max(1, math.ceil(ratio)))


# A round landing at most this share of its steps late (at least one step) keeps the local
# progress made meanwhile; a later one is mixed (Streaming DiLoCo's merge). The planner's lag bound
# (``planner.sync_choice.LAG_SHARE``) is the same share.
PROGRESS_LAG_SHARE = 0.1


def progress_lag_steps(round_steps: int) -> int:
    """The latest an overlapped round may land and keep the local progress made meanwhile: a tenth
    of its round, at least one step. The planner picks overlap only where the exchange fits in it
    (``planner.sync_choice``), calibration measures the loss at it, and a round landing on arrival
    is waited for there rather than applied later with staler progress."""
    return max(1, math.floor(PROGRESS_LAG_SHARE * round_steps))


def overlap_merge_for(delay: int, round_steps: int) -> str:
    """The merge of an overlapped DiLoCo round that lands ``delay`` steps after it was sent.
    ``progress`` (new anchor + local progress since the snapshot) where the delay is short: the
    round then lands as a blocking one would, shifted by a step or two. Streaming DiLoCo's ``mix``
    (half local, half new anchor) keeps replicas from drifting on long delays but pulls each back
    by half its outer step: on the calibration's slices (3 regions, H=20, one step late) it cost
    ~10 % held-out loss at 100 steps where keeping the progress cost 0.2 % (docs/sync.md)."""
    return "progress" if delay <= progress_lag_steps(round_steps) else "mix"
