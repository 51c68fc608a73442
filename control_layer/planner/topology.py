"""Sync topology between regions: ring order and gossip graph, from measured bandwidth."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

# Exact search over ring orders up to this many regions ((n-1)!/2 orders), greedy + 2-opt beyond.
EXACT_RING_MAX = 6
MAX_TWO_OPT_PASSES = 2

Bandwidth = Callable[[str, str], float]
Latency = Callable[[str, str], float]


def _ring_key(order: Sequence[str], bw: Bandwidth, lat: Latency) -> tuple[float, float, tuple[str, ...]]:
    edges = list(zip(order, list(order[1:]) + [order[0]], strict=True))
    bottleneck = min(min(bw(a, b), bw(b, a)) for a, b in edges)
    total_lat = sum(lat(a, b) for a, b in edges)
    # Widest bottleneck first, then least latency, then name order for determinism.
    return (-bottleneck, total_lat, tuple(order))


def order_ring(regions: Sequence[str], bw: Bandwidth, lat: Latency) -> list[str]:
    """Order regions so the ring's slowest link is as fast as possible (ties: least latency)."""
    names = sorted(set(regions))
    if len(names) <= 2:
        return names
    if len(names) <= EXACT_RING_MAX:
        first, rest = names[0], names[1:]
        best = min(
            ((first, *perm) for perm in itertools.permutations(rest) if perm[0] < perm[-1]),
            key=lambda o: _ring_key(o, bw, lat),
        )
        return list(best)
    return _greedy_two_opt(names, bw, lat)


def _greedy_two_opt(names: list[str], bw: Bandwidth, lat: Latency) -> list[str]:
    """Nearest-neighbour by bandwidth, then 2-opt moves that widen the bottleneck or cut latency."""
    n = len(names)
    b = [[min(bw(x, y), bw(y, x)) if x != y else 0.0 for y in names] for x in names]
    la = [[lat(x, y) if x != y else 0.0 for y in names] for x in names]
    order = [0]
    left = set(range(1, n))
    while left:
        here = order[-1]
        nxt = min(left, key=lambda j: (-b[here][j], la[here][j], names[j]))
        order.append(nxt)
        left.remove(nxt)

    def key(o: list[int]) -> tuple[float, float]:
        edges = list(zip(o, o[1:] + o[:1], strict=True))
        return (-min(b[i][j] for i, j in edges), sum(la[i][j] for i, j in edges))

    best = key(order)
    for _ in range(MAX_TWO_OPT_PASSES):
        improved = False
        for i in range(1, n - 1):
            for j in range(i + 1, n):
                cand = order[:i] + order[i : j + 1][::-1] + order[j + 1 :]
                k = key(cand)
                if k < best:
                    order, best, improved = cand, k, True
        if not improved:
            break
    return [names[i] for i in order]


def gossip_graph(ring: Sequence[str], peers: int, bw: Bandwidth) -> dict[str, list[str]]:
    """Each node keeps its ring neighbours (connectivity) and adds its widest links up to `peers`."""
    nodes = list(ring)
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    if len(nodes) < 2:
        return {n: [] for n in nodes}
    for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        if a != b:
            graph[a].add(b)
            graph[b].add(a)
    for a in nodes:
        others = sorted((n for n in nodes if n != a and n not in graph[a]), key=lambda n: (-bw(a, n), n))
        for b in others:
            if len(graph[a]) >= peers:
                break
            graph[a].add(b)
            graph[b].add(a)
    return {n: sorted(graph[n]) for n in nodes}


def cluster_gossip(
    ring: Sequence[str],
    region_of: Callable[[str], str],
    region_ring: Sequence[str],
    peers: int,
    bw: Bandwidth,
) -> dict[str, list[str]]:
    """Gossip between clusters: a region's first cluster in `ring` leads it and gossips with the
    leaders of its region-graph neighbours; the region's other clusters talk to their leader only."""
    leaders: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for c in ring:
        region = region_of(c)
        if leaders.setdefault(region, c) != c:
            members.setdefault(region, []).append(c)
    gossip: dict[str, list[str]] = {}
    for region, neighbours in gossip_graph(region_ring, peers, bw).items():
        lead = leaders[region]
        own = members.get(region, [])
        gossip[lead] = sorted({leaders[p] for p in neighbours} | set(own))
        for m in own:
            gossip[m] = [lead]
    return gossip
