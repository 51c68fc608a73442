"""Which running jobs a queued job of higher priority may preempt (the policy; the mechanism that
checkpoints, stops and requeues a victim lives apart and is handed to the placer).

Kueue's rule, for one resource: only jobs that allow it (``qos.preemptible``) and whose priority is
strictly lower are candidates; the lowest priority goes first, then the job holding the fewest
devices, then the most recently started (it loses the least work). Candidates are added in that
order until freeing their devices lets the job fit; the set is then pruned, newest choice first,
of every victim the job can fit without. No set that fits → no preemption at all.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    priority: int
    preemptible: bool
    devices: frozenset[Hashable]  # whatever names a device to ``fits``, e.g. (node_id, index)
    started_at: datetime


def candidates(running: Sequence[RunningJob], priority: int) -> list[RunningJob]:
    """Jobs the given priority may preempt, in the order they would be chosen."""
    eligible = [r for r in running if r.preemptible and r.priority < priority and r.devices]
    # most recently started first among equals: negate the timestamp by sorting twice (stable sort)
    eligible.sort(key=lambda r: (r.started_at, r.job_id), reverse=True)
    eligible.sort(key=lambda r: (r.priority, len(r.devices)))
    return eligible


def choose_victims(
    running: Sequence[RunningJob], priority: int, fits: Callable[[frozenset[Hashable]], bool]
) -> list[RunningJob]:
    """The fewest, lowest-priority victims whose devices, freed, let the job fit (``fits`` says
    whether it fits with the given extra devices free); [] when no choice of candidates does."""
    if fits(frozenset()):
        return []  # it fits already: nothing to preempt
    chosen: list[RunningJob] = []
    freed: frozenset[Hashable] = frozenset()
    for victim in candidates(running, priority):
        chosen.append(victim)
        freed = freed | victim.devices
        if fits(freed):
            break
    else:
        return []
    # Drop every victim the job fits without, the last added first (Kueue's minimal set).
    for victim in list(reversed(chosen[:-1])):
        rest = [v for v in chosen if v is not victim]
        if fits(frozenset().union(*(v.devices for v in rest))):
            chosen = rest
    return chosen


NOT_PREEMPTIBLE = "the running jobs of lower priority do not allow preemption (qos.preemptible: false)"


def why_no_preemption(priority: int, lowest_active: int | None, lowest_preemptible: int | None) -> str | None:
    """Why a job waiting on a full fleet preempts nothing although lower-priority work holds
    devices: none of that work allows it. None when there is no such work, or some may be preempted."""
    if lowest_active is None or priority <= lowest_active:
        return None  # nothing of lower priority runs: waiting is the plain answer
    if lowest_preemptible is not None and priority > lowest_preemptible:
        return None
    return NOT_PREEMPTIBLE
