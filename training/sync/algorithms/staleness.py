"""Staleness rules: SSP's bound and the parameter server's damping."""

from __future__ import annotations

import math


def ssp_ready(my_clock: int, peer_clocks: dict[str, int], staleness: int) -> list[str]:
    """Peers that hold this region back: after finishing clock ``my_clock`` a region may go on only
    once every peer has delivered clock ``my_clock - staleness`` (clocks count from 0; ``peer_clocks``
    holds the last clock received from each peer, -1 for none). Empty list: go on."""
    need = my_clock - staleness
    return sorted(p for p, c in peer_clocks.items() if c < need)


def async_scale(staleness: int, peers: int, damping: str) -> float:
    """Factor on an update based ``staleness`` server versions ago. In a full round each of
    ``peers`` regions pushes once, so ``peers - 1`` newer versions are normal; only the excess
    counts as staleness."""
    excess = max(0, staleness - (peers - 1))
    if damping == "inverse":
        return 1.0 / (1.0 + excess)
    if damping == "sqrt":
        return 1.0 / math.sqrt(1.0 + excess)
    if damping == "none":
        return 1.0
    raise ValueError(f"unknown damping {damping!r}")
