"""A replica's stage order along its nodes, searched: candidate orders priced by the walked schedule.

``spanning`` places a replica on whole nodes, each node one block of consecutive stages, and lays
the blocks out fastest port first, a cluster's nodes together and a region's clusters together
(``cross_cluster.cluster_order``, ``region_order``). Which block comes where decides every stage
boundary's ports, link and latency, and the walked 1F1B or GPipe schedule (``cm.pipeline_comm_s``)
prices what that costs the step: a replica that must take slow nodes can run faster with them at
the pipeline's ends, and a pipeline across clusters or regions faster when it crosses where the
stages on either side have the slack to hide the transfer. The runtime runs whatever order the
tasks say (``node_groups``: a node's block of stages fixes its node rank).

The orders tried keep a cluster's nodes together and a region's clusters together, so a pipeline
still crosses each cluster's pipe and each region's link at as few boundaries as its devices allow
(and the estimate's per-replica sharing of those pipes holds). Nodes of one cluster that hold as
many stages behind the same port are alike: their orders are one. A search walks at most
``REPLICA_OPS`` stage operations, and a quote's searches ``QUOTE_OPS`` together: every distinct
order is priced where they fit, else a local search from the given order (swapping two nodes of a
cluster, two clusters of a region or two regions, the first swap that walks faster taken each
time) until the share is spent. A candidate is priced by the estimate's own local step
(``local_step.ReplicaWalk``) over its stage links (``cross_cluster.pipeline_links``); an order
replaces the given one only where it walks faster. Where replicas are several groups, each keeps
its first node (its leader in the job's sync, whose port the walk does not see) first. Where
every replica lies in one cluster behind one port (the common case) nothing is priced
(``searchable``). Pure.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from contracts.errors import InvalidArgument
from control_layer.planner import cost_model as cm
from control_layer.planner.cross_cluster import Boundaries, node_clusters, pipe_shares, pipeline_links
from control_layer.planner.local_step import ReplicaWalk
from control_layer.planner.plan_types import Calibration, Slot
from control_layer.planner.snapshot import ResourceSnapshot

# What a search may walk, in stage operations (a forward or a backward of one micro-batch on one
# stage; 5-12 us each in the walk on these shared cores): per replica, and per quote over all its
# replicas and layouts (at most ~0.3-0.5 s and ~0.7-1.2 s on a cold cache). A replica's distinct orders are
# all priced where they fit its share (the 20 orders of 6 nodes of two kinds, one stage each of a
# pipeline of 128 micro-batches, take 8,640); beyond, the local search stops when it is spent.
REPLICA_OPS = 40_000
QUOTE_OPS = 100_000
# An order replaces the given one only where it walks faster by more than this (relative):
# rounding must not reorder a replica.
MIN_GAIN = 1e-9


class Budget:
    """Stage operations a quote's searches may still walk, and the walks they made: a replica
    priced again (the grouping search's composition, then the same nodes as listed) reads its
    walks back instead of spending the budget twice."""

    def __init__(self, ops: int = QUOTE_OPS) -> None:
        self.ops = ops
        self.walked: dict[tuple, float] = {}

    def pp_comm(self, walk: ReplicaWalk, links: cm.PipelineLinks) -> float:
        """``walk.pp_comm(links)``, walked once per quote (and charged once)."""
        p = walk.placement
        key = (p.tp, p.pp, p.zero, p.pp_schedule, walk.n_micro, walk.group_size, walk.pace, links)
        got = self.walked.get(key)
        if got is None:
            self.ops -= walk_ops(walk.pp, walk.n_micro)
            got = self.walked[key] = walk.pp_comm(links)
        return got


def walk_ops(pp: int, m: int) -> int:
    """Stage operations one priced order walks: ``cm.pipeline_comm_s`` walks m micro-batches, or
    2pp and 4pp of them where m is larger (and extrapolates)."""
    return 2 * pp * (m if m <= 4 * pp else 6 * pp)


Block = tuple[Slot, ...]  # one node's slots of a replica, in (stage, tp rank) order
Layout = list[list[list[int]]]  # per region, per cluster, block indices in pipeline order


def blocks(replica: Sequence[Slot]) -> list[Block]:
    """The replica's slots split by node, in order (a node holds one contiguous block)."""
    return [tuple(g) for _, g in itertools.groupby(replica, key=lambda s: s[1])]


def _signatures(bs: Sequence[Block], tp: int, snapshot: ResourceSnapshot) -> list[tuple]:
    """What of each node the walk reads: its cluster, how many stages it holds, its port."""
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    return [(b[0][0], len(b) // tp, clusters[b[0][0]].port(nodes[b[0][1]])) for b in bs]


def _layout(sigs: Sequence[tuple], region_of: dict[str, str]) -> Layout:
    """The given order as regions, clusters and nodes, each in first-appearance order."""
    regions: dict[str, dict[str, list[int]]] = {}
    for i, sig in enumerate(sigs):
        regions.setdefault(region_of[sig[0]], {}).setdefault(sig[0], []).append(i)
    return [list(clusters.values()) for clusters in regions.values()]


def _flat(layout: Layout) -> tuple[int, ...]:
    return tuple(i for region in layout for cluster in region for i in cluster)


def _distinct_orders(items: list[int], sigs: Sequence[tuple]) -> Iterator[list[int]]:
    """Every order of items whose sequence of signatures differs, alike items in their given order
    (multiset permutations)."""
    kinds = list(dict.fromkeys(sigs[i] for i in items))
    left = Counter(sigs[i] for i in items)
    queues = {k: [i for i in items if sigs[i] == k] for k in kinds}

    def rec(prefix: list[tuple]) -> Iterator[list[tuple]]:
        if len(prefix) == len(items):
            yield list(prefix)
            return
        for k in kinds:
            if left[k]:
                left[k] -= 1
                prefix.append(k)
                yield from rec(prefix)
                prefix.pop()
                left[k] += 1

    for seq in rec([]):
        taken = dict.fromkeys(kinds, 0)
        out = []
        for k in seq:
            out.append(queues[k][taken[k]])
            taken[k] += 1
        yield out


def _count(items: list[int], sigs: Sequence[tuple]) -> int:
    counts = Counter(sigs[i] for i in items)
    n = math.factorial(len(items))
    for c in counts.values():
        n //= math.factorial(c)
    return n


def order_count(layout: Layout, sigs: Sequence[tuple]) -> int:
    """How many distinct orders keep clusters and regions together."""
    n = math.factorial(len(layout))
    for region in layout:
        n *= math.factorial(len(region))
        for cluster in region:
            n *= _count(cluster, sigs)
    return n


def _all_orders(layout: Layout, sigs: Sequence[tuple]) -> Iterator[tuple[int, ...]]:
    """Every distinct order."""
    per_cluster = [[list(_distinct_orders(c, sigs)) for c in region] for region in layout]
    for regions in itertools.permutations(range(len(layout))):
        for clusters in itertools.product(*(itertools.permutations(range(len(r))) for r in layout)):
            choices = [[per_cluster[r][c] for c in clusters[r]] for r in regions]
            for picks in itertools.product(*(itertools.product(*region) for region in choices)):
                yield tuple(i for region in picks for cluster in region for i in cluster)


def _swaps(layout: Layout, sigs: Sequence[tuple]) -> Iterator[Layout]:
    """Layouts one swap away: two unlike nodes of a cluster, two clusters of a region, two regions."""
    for r, region in enumerate(layout):
        for c, cluster in enumerate(region):
            for i, j in itertools.combinations(range(len(cluster)), 2):
                if sigs[cluster[i]] != sigs[cluster[j]]:
                    new = [list(map(list, reg)) for reg in layout]
                    new[r][c][i], new[r][c][j] = cluster[j], cluster[i]
                    yield new
        for i, j in itertools.combinations(range(len(region)), 2):
            new = [list(map(list, reg)) for reg in layout]
            new[r][i], new[r][j] = region[j], region[i]
            yield new
    for i, j in itertools.combinations(range(len(layout)), 2):
        new = [list(map(list, reg)) for reg in layout]
        new[i], new[j] = layout[j], layout[i]
        yield new


def _best(
    layout: Layout,
    sigs: Sequence[tuple],
    price: Callable[[tuple[int, ...]], float],
    walks: int,
    keep_head: bool,
) -> tuple[tuple[int, ...], bool]:
    """The order that walks fastest of at most ``walks`` priced: all of them where they are as
    few, else a local search from the given order; and whether every order was priced.
    ``keep_head``: only orders that keep the given first node first."""
    given = _flat(layout)
    best, best_s = given, price(given)

    def allowed(order: tuple[int, ...]) -> bool:
        return not keep_head or order[0] == given[0]

    if order_count(layout, sigs) <= walks:
        for order in filter(allowed, _all_orders(layout, sigs)):
            t = price(order)
            if t < best_s * (1.0 - MIN_GAIN):
                best, best_s = order, t
        return best, True
    walked, improved = 1, True
    while improved and walked < walks:
        improved = False
        for new in _swaps(layout, sigs):
            order = _flat(new)
            if not allowed(order):
                continue
            t = price(order)
            walked += 1
            if t < best_s * (1.0 - MIN_GAIN):
                layout, best, best_s, improved = new, order, t, True
                break
            if walked >= walks:
                break
    return best, False


def _boundaries(order: Sequence[Block], tp: int) -> Boundaries:
    """Per stage boundary, the (sending, receiving) node: a stage's tp ranks share one node."""
    stage_nodes = [b[0][1] for b in order for _ in range(len(b) // tp)]
    return tuple(((stage_nodes[k], stage_nodes[k + 1]),) for k in range(len(stage_nodes) - 1))


def searchable(replicas: Sequence[Sequence[Slot]], tp: int, snapshot: ResourceSnapshot) -> bool:
    """Whether some replica's nodes differ in port or lie in two clusters or more. Where a
    replica's nodes share one cluster and one port, an order changes only which boundaries stay
    inside a node: on the planner benchmark's quotes (10 to 1,000 clusters, nodes of 8 devices
    holding uneven blocks of stages) 452 such searches changed no answer and cost ~7 ms each, so
    they are not made."""
    for replica in replicas:
        bs = blocks(replica)
        if len(bs) >= 2 and len({sig[::2] for sig in _signatures(bs, tp, snapshot)}) > 1:
            return True
    return False


@dataclass(frozen=True)
class Ordered:
    """A replica's slots in the order that walks fastest of those priced, the stage links of that
    order, the seconds its transfers add as walked (None: not walked, there was nothing to
    choose or no budget), and whether every order was priced."""

    slots: list[Slot]
    links: cm.PipelineLinks | None
    pp_comm_s: float | None
    exhaustive: bool


def best_order(
    replica: Sequence[Slot],
    tp: int,
    walk: ReplicaWalk,
    snapshot: ResourceSnapshot,
    calibration: Calibration | None,
    budget: Budget,
    keep_head: bool,
    others: Counter[str] | None = None,
) -> Ordered:
    """One replica's node blocks in the order that walks fastest (``walk`` prices it), within
    what is left of ``budget``; ``others``: the other replicas' crossings of shared pipes
    (``cross_cluster.pipe_shares``), none by default. ``keep_head``: its first node stays first."""
    region_of = snapshot.region_of()
    cluster_of = node_clusters(snapshot)
    nodes = snapshot.nodes_by_id()
    bs = blocks(replica)
    sigs = _signatures(bs, tp, snapshot)
    layout = _layout(sigs, region_of)
    others = others if others is not None else Counter()
    links_of: dict[tuple[int, ...], cm.PipelineLinks | None] = {}
    seconds: dict[cm.PipelineLinks, float] = {}

    def links(order: tuple[int, ...]) -> cm.PipelineLinks | None:
        if order not in links_of:
            bounds = _boundaries([bs[i] for i in order], tp)
            try:
                links_of[order] = pipeline_links(
                    bounds,
                    cluster_of,
                    nodes,
                    snapshot,
                    walk.pace.intra_bw,
                    walk.pace.intra_lat,
                    others + pipe_shares([bounds], cluster_of),
                    tp,
                    calibration,
                )
            except InvalidArgument:  # two regions without a link: this order cannot run
                links_of[order] = None
        return links_of[order]

    def price(order: tuple[int, ...]) -> float:
        got = links(order)
        if got is None:
            return math.inf
        if got not in seconds:
            seconds[got] = budget.pp_comm(walk, got)
        return seconds[got]

    n_walks = min(REPLICA_OPS, budget.ops) // walk_ops(walk.pp, walk.n_micro)
    given = _flat(layout)
    if len(bs) < 2 or order_count(layout, sigs) <= 1 or n_walks < 2:
        return Ordered(
            [s for i in given for s in bs[i]],
            links(given) if len(bs) > 1 else None,
            None,
            len(bs) < 2 or order_count(layout, sigs) <= 1,
        )
    order, exhaustive = _best(layout, sigs, price, n_walks, keep_head)
    chosen = links(order)
    return Ordered(
        [s for i in order for s in bs[i]], chosen, seconds.get(chosen) if chosen else None, exhaustive
    )


def search_orders(
    replicas: Sequence[Sequence[Slot]],
    tp: int,
    walks: Sequence[ReplicaWalk],
    snapshot: ResourceSnapshot,
    calibration: Calibration | None,
    budget: Budget | None = None,
) -> list[list[Slot]]:
    """Each replica's slots with its node blocks in the order that walks fastest (``walks[r]``
    prices replica r); alike replicas (the same signatures in the same order) are searched once,
    each search within what is left of ``budget`` (a fresh quote's by default). Each replica is a
    torchrun group of its own (``spanning``), led by the node holding its first stage: where there
    are several, they meet through the job's sync at their leaders' ports, which the walk does not
    see, so the given first node (the replica's fastest port) stays first."""
    keep_head = len(replicas) > 1
    budget = budget or Budget()
    cluster_of = node_clusters(snapshot)
    split = [blocks(r) for r in replicas]
    current = [_boundaries(bs, tp) for bs in split]
    shares = pipe_shares(current, cluster_of)
    found: dict[tuple, list[int]] = {}
    out: list[list[Slot]] = []
    for r, bs in enumerate(split):
        key = tuple(_signatures(bs, tp, snapshot))
        if key not in found:
            # The other replicas' crossings as they are, this one's as the candidate has them.
            others = shares - pipe_shares([current[r]], cluster_of)
            ordered = best_order(replicas[r], tp, walks[r], snapshot, calibration, budget, keep_head, others)
            position = {b[0][1]: i for i, b in enumerate(bs)}
            found[key] = [position[b[0][1]] for b in blocks(ordered.slots)]
        out.append([s for i in found[key] for s in bs[i]])
    return out
