"""Which nodes of one cluster form each replica of a spanning placement, searched (``spanning``).

A replica's local step depends only on what its walk reads of its nodes, their *kind*: the
port (Gb/s, latency), how many stages the node holds and its measured rate; and on the order of
their blocks of stages (``stage_order``). Within one cluster no pipe is shared between replicas,
so a replica is priced by its *composition* alone: how many nodes of each kind it takes whole,
and at most one more it takes in part (a pipeline of pp stages over nodes of k stages each).
The search prices every composition once, at the order that walks fastest, then chooses how many
replicas of each to form from the nodes there are (small integer programs, scipy's HiGHS): as
many replicas as wanted or as the nodes hold, the slowest of them as fast as it can be (the step
waits for it), then the least seconds summed over them (so a fast node is not spent where a slow
one does as well). Islands of fast boundaries (many stages behind one node) and slow nodes spread
over the replicas fall out of that choice; they are not rules of their own.

The bound: a replica's step is at least its compute with free transfers (``ReplicaWalk.floor_s``),
and, where every order of its composition was walked, that order's step. The least slowest
replica over every choice of compositions, each at that floor, bounds every grouping of these
nodes (each node one replica's, as the runtime runs a spanning replica): where every composition
was walked in every order it equals the slowest replica found (gap 0); elsewhere the gap says how
far from optimal the grouping found can be. Nodes all of one kind (the usual cluster) have one
composition worth taking: their replicas are formed without pricing (the estimate prices them),
bounded by the floor. Where there are more compositions than ``MAX_COMPOSITIONS``, replicas are
dealt greedily (``balanced``) and bounded by the floor alone. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from contracts.worker_config import MAX_GROUP_NODES
from control_layer.planner.listing import natural
from control_layer.planner.plan_types import Slot

# Compositions priced per cluster and layout at most: each is one stage-order search.
MAX_COMPOSITIONS = 48

Entry = tuple[str, str, tuple[int, ...]]  # cluster id, node id, its free devices
Kind = tuple  # what the walk reads of a node, comparable: fastest port first (``spanning``)


@dataclass(frozen=True)
class Composition:
    """One replica's nodes by kind: ``whole[k]`` nodes of kind k hold all their stages, and
    ``part`` (a kind, -1: none) names one more that holds ``part_stages`` of its stages."""

    whole: tuple[int, ...]
    part: int = -1
    part_stages: int = 0

    def uses(self, kind: int) -> int:
        return self.whole[kind] + (1 if self.part == kind else 0)


@dataclass(frozen=True)
class Priced:
    """A replica's slots in the order that walks fastest of those priced, its step there, its
    floor (transfers free), and whether every order was walked."""

    slots: list[Slot]
    seconds: float
    floor_s: float
    exhaustive: bool


@dataclass(frozen=True)
class Grouping:
    replicas: list[list[Slot]]  # each in its stage order; fewer than wanted where the nodes hold fewer
    slowest_s: float | None  # the slowest replica's step as priced (None: not priced)
    lower_bound_s: float  # no grouping of these nodes has a faster slowest replica
    exact: bool  # every composition priced, each in every order: the bound is the answer
    compositions: int


def compositions(
    stages: Sequence[int], counts: Sequence[int], pp: int, limit: int
) -> list[Composition] | None:
    """Every composition of pp stages over kinds holding ``stages[k]`` stages a node, at most
    ``counts[k]`` nodes of each and ``MAX_GROUP_NODES`` in all; None where there are more than
    ``limit``."""
    out: list[Composition] = []
    whole = [0] * len(stages)

    def close(left: int, used: int) -> bool:
        if left == 0:
            out.append(Composition(tuple(whole)))
        elif used < MAX_GROUP_NODES:
            for k, s in enumerate(stages):
                if s > left and whole[k] < counts[k]:
                    out.append(Composition(tuple(whole), k, left))
        return len(out) <= limit

    def rec(k: int, left: int, used: int) -> bool:
        if k == len(stages):
            return close(left, used)
        most = min(counts[k], left // stages[k], MAX_GROUP_NODES - used)
        for n in range(most, -1, -1):
            whole[k] = n
            if not rec(k + 1, left - n * stages[k], used + n):
                return False
        whole[k] = 0
        return True

    return out if rec(0, pp, 0) else None


def _pack(
    use: np.ndarray, counts: np.ndarray, want: int, allowed: np.ndarray, cost: np.ndarray | None
) -> np.ndarray | None:
    """Replicas per composition (integers): exactly ``want`` of them, within the nodes of each
    kind, only allowed compositions; least ``cost`` summed where given. None: not feasible."""
    n = use.shape[1]
    upper = np.where(allowed, want, 0).astype(float)
    constraints = [LinearConstraint(use, 0, counts), LinearConstraint(np.ones((1, n)), want, want)]
    objective = cost if cost is not None else np.zeros(n)
    res = milp(objective, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, upper))
    if res.status != 0 or res.x is None:
        return None
    return np.round(res.x).astype(int)


def _most(use: np.ndarray, counts: np.ndarray, need: int) -> int:
    """How many replicas (at most ``need``) the nodes can form."""
    n = use.shape[1]
    res = milp(
        -np.ones(n),
        constraints=[LinearConstraint(use, 0, counts), LinearConstraint(np.ones((1, n)), 0, need)],
        integrality=np.ones(n),
        bounds=Bounds(0, need),
    )
    return 0 if res.status != 0 or res.x is None else int(round(-res.fun))


def _least_slowest(use: np.ndarray, counts: np.ndarray, want: int, seconds: np.ndarray) -> float:
    """The least slowest replica over every choice of ``want`` replicas, each composition at
    ``seconds``: the smallest of those values some choice keeps all its replicas within."""
    levels = np.unique(seconds)
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _pack(use, counts, want, seconds <= levels[mid], None) is None:
            lo = mid + 1
        else:
            hi = mid
    return float(levels[lo])


def group(
    entries: Sequence[Entry],
    kind_of: Callable[[Entry], Kind],
    tp: int,
    pp: int,
    need: int,
    price: Callable[[list[Slot]], Priced],
    floor_s: float,
) -> Grouping | None:
    """Up to ``need`` replicas of tp × pp devices from these nodes (of one cluster), each node
    one replica's, the slowest replica as fast as the compositions priced allow; None where the
    nodes hold none. ``floor_s``: no replica here is faster (its compute at the fastest node's
    rate, transfers free), the bound where compositions are too many to price."""
    kinds = sorted({kind_of(e) for e in entries if len(e[2]) >= tp})
    if not kinds:
        return None
    members = {k: sorted((e for e in entries if kind_of(e) == k), key=lambda e: natural(e[1])) for k in kinds}
    stages = [len(members[k][0][2]) // tp for k in kinds]
    counts = [len(members[k]) for k in kinds]
    found = compositions(stages, counts, pp, MAX_COMPOSITIONS)
    if found is None:
        return _dealt(entries, kind_of, tp, pp, need, price, floor_s)
    if not found:
        return None
    if len(kinds) == 1:
        return _alike(found, members[kinds[0]], stages[0], counts[0], tp, need, floor_s)
    use = np.array([[c.uses(k) for c in found] for k in range(len(kinds))], dtype=float)
    limit = np.array(counts, dtype=float)
    want = _most(use, limit, need)
    if want == 0:
        return None
    priced = [price(_representative(c, [members[k] for k in kinds], stages, tp)) for c in found]
    seconds = np.array([p.seconds for p in priced])
    floors = np.array([max(floor_s, p.seconds if p.exhaustive else p.floor_s) for p in priced])
    slowest = _least_slowest(use, limit, want, seconds)
    chosen = _pack(use, limit, want, seconds <= slowest, seconds)
    assert chosen is not None  # the least slowest is feasible by construction
    bound = _least_slowest(use, limit, want, floors)
    replicas = _materialise(found, priced, chosen, [members[k] for k in kinds], kinds, kind_of, tp)
    exact = all(p.exhaustive for p in priced)
    return Grouping(replicas, slowest, bound, exact, len(found))


def _alike(
    found: list[Composition], nodes: list[Entry], stages: int, count: int, tp: int, need: int, floor_s: float
) -> Grouping | None:
    """Nodes all of one kind: the one composition that uses the fewest nodes (whole nodes, then
    the rest of the stages on one more), as many replicas as the nodes hold; its order is not
    searched (nodes behind one port: an order moves only which boundaries stay inside a node),
    so the floor bounds it."""
    c = min(found, key=lambda c: (c.uses(0), c.part_stages))
    want = min(need, count // c.uses(0))
    if want == 0:
        return None
    replicas: list[list[Slot]] = []
    for r in range(want):
        mine = nodes[r * c.uses(0) : (r + 1) * c.uses(0)]
        replica = [(cid, node, d) for cid, node, free in mine[: c.whole[0]] for d in free[: stages * tp]]
        if c.part == 0:
            cid, node, free = mine[-1]
            replica += [(cid, node, d) for d in free[: c.part_stages * tp]]
        replicas.append(replica)
    return Grouping(replicas, None, floor_s, False, 1)


def _dealt(
    entries: Sequence[Entry],
    kind_of: Callable[[Entry], Kind],
    tp: int,
    pp: int,
    need: int,
    price: Callable[[list[Slot]], Priced],
    floor_s: float,
) -> Grouping | None:
    """Too many compositions to price: replicas dealt greedily (``balanced``), each priced at the
    order that walks fastest, bounded by the floor alone."""
    replicas = balanced(entries, kind_of, tp, pp, need)
    if not replicas:
        return None
    entry_of = {e[1]: e for e in entries}

    def signature(slots: Sequence[Slot]) -> list[tuple]:
        return [(kind_of(entry_of[n]), k) for n, k in _blocks(slots)]

    seen: dict[tuple, Priced] = {}
    out: list[list[Slot]] = []
    for replica in replicas:
        key = tuple(sorted(signature(replica)))
        if key not in seen:
            seen[key] = price(replica)
        # The priced order on this replica's own nodes: alike blocks take its nodes in turn.
        mine: dict[tuple, list[str]] = {}
        for (kind, k), (n, _) in zip(signature(replica), _blocks(replica), strict=True):
            mine.setdefault((kind, k), []).append(n)
        own = [mine[block].pop(0) for block in signature(seen[key].slots)]
        out.append([s for n in own for s in replica if s[1] == n])
    slowest = max(p.seconds for p in seen.values())
    return Grouping(out, slowest, min(floor_s, slowest), False, 0)


def _representative(c: Composition, members: list[list[Entry]], stages: list[int], tp: int) -> list[Slot]:
    """Slots of one replica of composition c on distinct nodes of each kind, fastest kind first."""
    out: list[Slot] = []
    for k, nodes in enumerate(members):
        for cid, node, free in nodes[: c.whole[k]]:
            out += [(cid, node, d) for d in free[: stages[k] * tp]]
        if c.part == k:
            cid, node, free = nodes[c.whole[k]]
            out += [(cid, node, d) for d in free[: c.part_stages * tp]]
    return out


def _materialise(
    found: list[Composition],
    priced: list[Priced],
    chosen: np.ndarray,
    members: list[list[Entry]],
    kinds: list[Kind],
    kind_of: Callable[[Entry], Kind],
    tp: int,
) -> list[list[Slot]]:
    """The chosen replicas on concrete nodes, fastest composition first: each in its priced order,
    every block on the next unused node of the block's kind (nodes of a kind are alike)."""
    index = {k: i for i, k in enumerate(kinds)}
    entry_of = {e[1]: e for nodes in members for e in nodes}
    taken = [0] * len(members)
    out: list[list[Slot]] = []
    for c in sorted(range(len(found)), key=lambda i: (priced[i].seconds, i)):
        for _ in range(int(chosen[c])):
            replica: list[Slot] = []
            for node_id, n_devices in _blocks(priced[c].slots):
                k = index[kind_of(entry_of[node_id])]
                cid, node, free = members[k][taken[k]]
                taken[k] += 1
                replica += [(cid, node, d) for d in free[:n_devices]]
            out.append(replica)
    return out


def _blocks(slots: Sequence[Slot]) -> list[tuple[str, int]]:
    """(node id, devices) of each node's block, in order."""
    out: list[tuple[str, int]] = []
    for _, node, _ in slots:
        if out and out[-1][0] == node:
            out[-1] = (node, out[-1][1] + 1)
        else:
            out.append((node, 1))
    return out


def balanced(
    entries: Sequence[Entry], kind_of: Callable[[Entry], Kind], tp: int, pp: int, need: int
) -> list[list[Slot]]:
    """Replicas dealt greedily where compositions are too many to price: nodes fastest kind first
    (each kind's nodes by id), each to the replica with the most stages still to fill that it
    fits whole, else the one it completes in part; replicas left unfilled are dropped."""
    nodes = sorted((e for e in entries if len(e[2]) >= tp), key=lambda e: (kind_of(e), natural(e[1])))
    bins: list[list[Slot]] = [[] for _ in range(need)]
    for cid, node, free in nodes:
        held = len(free) // tp
        room = [pp - len(b) // tp for b in bins]
        fits = [
            i for i in range(need) if room[i] >= held and len({n for _, n, _ in bins[i]}) < MAX_GROUP_NODES
        ]
        part = [i for i in range(need) if 0 < room[i] < held]
        if fits:
            i = max(fits, key=lambda j: (room[j], -j))
            bins[i] += [(cid, node, d) for d in free[: held * tp]]
        elif part:
            i = max(part, key=lambda j: (room[j], -j))
            bins[i] += [(cid, node, d) for d in free[: room[i] * tp]]
    return [b for b in bins if len(b) == tp * pp]
