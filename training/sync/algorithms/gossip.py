"""Gossip topology and mixing: time-varying graphs, pairwise averaging, push-sum."""

from __future__ import annotations

import math

from torch import Tensor


def exponential_peers(regions: list[str], me: str, round_index: int, k: int) -> list[str]:
    """One-peer (or k-peer) exponential graph: at round r region i contacts i + 2^((r + m) mod L)."""
    n = len(regions)
    if n < 2:
        return []
    i = sorted(regions).index(me)
    levels = max(1, math.ceil(math.log2(n)))
    out: list[str] = []
    for m in range(k):
        peer = sorted(regions)[(i + 2 ** ((round_index + m) % levels)) % n]
        if peer != me and peer not in out:
            out.append(peer)
    return out


def peers_for_round(
    regions: list[str], me: str, round_index: int, k: int, graph: list[dict[str, list[str]]] | None
) -> list[str]:
    if graph is None:
        return exponential_peers(regions, me, round_index, k)
    return [p for p in graph[round_index % len(graph)].get(me, []) if p != me]


def pairwise_correction(mine: Tensor, theirs: Tensor, weight: float) -> Tensor:
    """What one side of a pairwise average adds to its parameters: both sides add opposite
    corrections, so the sum over regions is unchanged."""
    return weight * (theirs - mine)


def push_sum_combine(x: Tensor, w: float, shares: list[tuple[Tensor, float]]) -> tuple[Tensor, float]:
    """Fold received push-sum shares ``(z_j, w_j)`` (z = x / w of the sender) into ``(x, w)``."""
    for z, ws in shares:
        x = x + ws * z
        w += ws
    return x, w
