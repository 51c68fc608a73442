"""Which links between regions a job's cross-region sync sends on, read from its accepted option
(pure: option JSON in, directed region pairs out).

The workers' own rules, at region granularity (``training.sync``): gossip mixes along the option's
graph; async sends to and from the parameter server (the first participant by name); every other
mode runs a ring over the option's order with three or more regions, and with two each region
pushes its contribution to the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Edge = tuple[str, str]


@dataclass(frozen=True)
class SyncEdges:
    mode: str
    shape: str  # ring | pair | gossip | star | none
    edges: tuple[Edge, ...]


def _region_of(option: Mapping[str, Any]) -> dict[str, str]:
    """Cluster id -> region, from the option's tasks."""
    out: dict[str, str] = {}
    for t in option.get("tasks") or []:
        if isinstance(t, Mapping) and isinstance(t.get("cluster"), str) and isinstance(t.get("region"), str):
            out.setdefault(t["cluster"], t["region"])
    return out


def _dedupe(edges: list[Edge]) -> tuple[Edge, ...]:
    return tuple(dict.fromkeys((a, b) for a, b in edges if a != b))


def job_sync_edges(option: Mapping[str, Any] | None) -> SyncEdges:
    """The directed region pairs the job's leaders send on; none for a one-region job."""
    option = option or {}
    sync = option.get("sync") or {}
    mode = str(sync.get("mode") or "")
    region_of = _region_of(option)
    ring_clusters = [c for c in sync.get("ring") or [] if isinstance(c, str)]
    regions = list(dict.fromkeys(region_of[c] for c in ring_clusters if c in region_of))
    regions += sorted(set(region_of.values()) - set(regions))
    if len(regions) < 2:
        return SyncEdges(mode, "none", ())
    if mode == "gossip":
        graph = sync.get("gossip") or {}
        edges = [
            (region_of[src], region_of[dst])
            for src, dsts in sorted(graph.items())
            if src in region_of
            for dst in dsts or []
            if dst in region_of
        ]
        return SyncEdges(mode, "gossip", _dedupe(edges))
    if mode == "async":
        ps = sorted(regions)[0]
        edges = [(r, ps) for r in regions if r != ps] + [(ps, r) for r in regions if r != ps]
        return SyncEdges(mode, "star", _dedupe(edges))
    if len(regions) == 2:
        a, b = regions
        return SyncEdges(mode, "pair", ((a, b), (b, a)))
    ring = [(regions[i], regions[(i + 1) % len(regions)]) for i in range(len(regions))]
    return SyncEdges(mode, "ring", _dedupe(ring))
