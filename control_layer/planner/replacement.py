"""Where a lost task of a running job goes: one node with enough free devices of the right kind,
within the job's QoS, its own region first, then the cheapest. Pure: (spec, snapshot) -> choice.

Only the lost task moves; the job's other tasks keep their devices and keep training, so this is
not a plan of the whole job but a like-for-like replacement of one torchrun group.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.job_spec import JobSpec
from control_layer.planner.fleet import filter_fleet
from control_layer.planner.snapshot import ResourceSnapshot


@dataclass(frozen=True)
class Replacement:
    cluster_id: str
    node_id: str
    region: str
    devices: tuple[int, ...]
    price: float


def pick_replacement(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    *,
    devices: int,
    kinds: frozenset[str],
    prefer_region: str,
    exclude_nodes: frozenset[str] = frozenset(),
) -> Replacement | None:
    """The node that takes over a task of ``devices`` devices of one of ``kinds`` ("cuda", "cpu"),
    or None when no node can. Same region first (its data and links are the ones planned), then
    the lowest device price; ties by ids, so the choice is deterministic. With ``data.shards`` only
    the same region: the lost task's stage section reads that region's shard, which may be resident."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    best: tuple[tuple[object, ...], Replacement] | None = None
    for pool in filter_fleet(spec, snapshot).pools:
        if pool.kind not in kinds or (spec.data.shards and pool.region != prefer_region):
            continue
        for node_id, free in pool.nodes:
            if node_id in exclude_nodes or len(free) < devices:
                continue
            choice = Replacement(
                pool.cluster.id, node_id, pool.region, tuple(sorted(free)[:devices]), pool.price
            )
            key = (pool.region != prefer_region, pool.price, pool.cluster.id, node_id)
            if best is None or key < best[0]:
                best = (key, choice)
    return best[1] if best else None
