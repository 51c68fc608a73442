"""Which links to probe now: pure, data in and data out.

A link here is an ordered region pair (src probes, dst receives the bulk transfer); each region is
represented by its most recently registered alive node that serves probes, so a node that has just
registered is the one measured.

**Budget.** A probe occupies its link for ``duration_s`` (the echoes plus the bulk transfer, timed
by the prober). The next probe of that link waits at least ``duration_s / budget`` after it, so
probes take at most ``budget`` (default 1 %) of the link's time, whatever its speed:
4 MiB at 100 Mbit/s takes ~0.35 s, so at most one probe per 35 s; the default interval of 600 s
makes it 0.06 %. A node is in at most one probe at a time, so two probes never share a link and
measure each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Pair = tuple[str, str]  # (src region, dst region)


@dataclass(frozen=True)
class ProbeEndpoint:
    node_id: str
    region: str
    host: str
    port: int
    registered_at: float  # unix seconds


@dataclass(frozen=True)
class PairHistory:
    """The newest probe of one ordered pair."""

    requested_at: float
    duration_s: float | None  # None: still pending, or failed before it took any link time
    pending: bool


@dataclass(frozen=True)
class ProbePolicy:
    interval_s: float  # at most this long between probes of a link
    budget: float  # share of a link's time probes may take (0.01 = 1 %)


@dataclass(frozen=True)
class ProbePlan:
    src: ProbeEndpoint
    dst: ProbeEndpoint


def representatives(endpoints: Sequence[ProbeEndpoint]) -> dict[str, ProbeEndpoint]:
    """Per region, the newest registered endpoint (ties broken by node id, for determinism)."""
    out: dict[str, ProbeEndpoint] = {}
    for ep in sorted(endpoints, key=lambda e: (e.registered_at, e.node_id)):
        out[ep.region] = ep
    return out


def next_due(h: PairHistory, policy: ProbePolicy) -> float:
    """When the pair may be probed again: after the interval, and never within the budget's wait."""
    wait = policy.interval_s
    if h.duration_s is not None and h.duration_s > 0:
        wait = max(wait, h.duration_s / policy.budget)
    return h.requested_at + wait


def plan_round(
    endpoints: Sequence[ProbeEndpoint],
    history: Mapping[Pair, PairHistory],
    busy_nodes: set[str],
    now: float,
    policy: ProbePolicy,
) -> list[ProbePlan]:
    """The probes to order now. A pair is due when it was never probed, when its representative
    node registered after its last probe (a new or restarted node), or when ``next_due`` has
    passed; a pair with a probe pending waits for it. Most overdue first; each node in one probe."""
    reps = representatives(endpoints)
    due: list[tuple[float, Pair]] = []
    for src in sorted(reps):
        for dst in sorted(reps):
            if src == dst:
                continue
            h = history.get((src, dst))
            if h is None:
                due.append((float("-inf"), (src, dst)))
                continue
            if h.pending:
                continue
            registered = max(reps[src].registered_at, reps[dst].registered_at)
            # Re-registration is cheap to spot but the budget still holds: a node restarting in a
            # loop cannot make its links probed more often than the budget allows.
            budget_ok = h.duration_s is None or now >= h.requested_at + h.duration_s / policy.budget
            if (registered > h.requested_at and budget_ok) or now >= next_due(h, policy):
                due.append((h.requested_at, (src, dst)))
    taken = set(busy_nodes)
    plans: list[ProbePlan] = []
    for _, (src, dst) in sorted(due):
        a, b = reps[src], reps[dst]
        if a.node_id in taken or b.node_id in taken:
            continue
        taken |= {a.node_id, b.node_id}
        plans.append(ProbePlan(a, b))
    return plans
