"""Pipelines whose stages sit in two or more clusters of one region.

A node whose agent declared its torchrun endpoint reachable from the region's other clusters
(``NodeInfo.cross_cluster_groups``) may share a replica with nodes there (``node_group_problems``).
A stage boundary between two clusters leaves through the sender's fabric port, crosses the
region's local link (``ResourceSnapshot.link(region, region)``: the declared or probed figure, else
the snapshot's default local link), read as each cluster's port into the region's network, one pipe
per direction, and enters through the receiver's port; it pays the local link's latency. The
replicas whose boundaries cross out of (or into) one cluster at once share that cluster's pipe.
Pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import Calibration
from control_layer.planner.snapshot import ClusterInfo, NodeInfo, ResourceSnapshot

Boundaries = tuple[tuple[tuple[str, str], ...], ...]  # per stage boundary, (sending, receiving) nodes


def reachable_nodes(snapshot: ResourceSnapshot) -> frozenset[str]:
    """Node ids that declared their group endpoint reachable from other clusters (kept with the
    snapshot)."""
    return snapshot.derived(
        "cross_cluster_nodes",
        lambda s: frozenset(n.id for c in s.clusters for n in c.nodes if n.cross_cluster_groups),
    )


def node_clusters(snapshot: ResourceSnapshot) -> dict[str, ClusterInfo]:
    """Node id -> its cluster (kept with the snapshot)."""
    return snapshot.derived("node_clusters", lambda s: {n.id: c for c in s.clusters for n in c.nodes})


def crossing_pairs(boundaries: Boundaries, cluster_of: dict[str, ClusterInfo]) -> set[tuple[str, str]]:
    """The (sending cluster, receiving cluster) pairs a replica's forward transfers cross."""
    return {
        (cluster_of[a].id, cluster_of[b].id)
        for pairs in boundaries
        for a, b in pairs
        if cluster_of[a].id != cluster_of[b].id
    }


def pipe_shares(replica_boundaries: Iterable[Boundaries], cluster_of: dict[str, ClusterInfo]) -> Counter[str]:
    """Per cluster, how many replicas cross out of or into it: in lockstep their transfers meet
    on its pipe into the region's network (max-min fair, an equal share each)."""
    shares: Counter[str] = Counter()
    for boundaries in replica_boundaries:
        for a, b in crossing_pairs(boundaries, cluster_of):
            shares[a] += 1
            shares[b] += 1
    return shares


def pipeline_links(
    boundaries: Boundaries,
    cluster_of: dict[str, ClusterInfo],
    nodes: dict[str, NodeInfo],
    snapshot: ResourceSnapshot,
    local_bw: float,
    local_lat: float,
    shares: Counter[str],
    tp: int,
    calibration: Calibration | None,
) -> cm.PipelineLinks:
    """How a replica across nodes reaches its stages: each stage's port is its node's in its own
    cluster (the slowest of its tp ranks' nodes); a boundary inside a node runs at ``local_bw``, one
    between two nodes of a cluster pays the larger latency of the two, one between clusters also
    crosses the region's local link at the share of it each of its tp ranks' transfers gets (the
    ``shares`` replicas' tp ranks all send at once), and pays its latency."""

    def port(node_id: str) -> tuple[float, float]:
        c = cluster_of[node_id]
        gbps, lat_ms = c.port(nodes[node_id])
        return cm.bytes_per_s(gbps, cm.link_goodput(c.region, c.region, calibration)), lat_ms / 1000.0

    pp = len(boundaries) + 1
    stage_nodes: list[set[str]] = [set() for _ in range(pp)]
    for k, pairs in enumerate(boundaries):
        for a, b in pairs:
            stage_nodes[k].add(a)
            stage_nodes[k + 1].add(b)
    ports = tuple(min(port(n)[0] for n in on) for on in stage_nodes)
    across, latency, link_bw = [], [], []
    for pairs in boundaries:
        crossing = [(a, b) for a, b in pairs if a != b]
        across.append(bool(crossing))
        between = [
            (cluster_of[a], cluster_of[b]) for a, b in crossing if cluster_of[a].id != cluster_of[b].id
        ]
        if not between:
            latency.append(max([local_lat, *(max(port(a)[1], port(b)[1]) for a, b in crossing)]))
            link_bw.append(math.inf)
            continue
        rates, lats = [], []
        for ca, cb in between:
            link = snapshot.link(ca.region, cb.region)
            if link is None or ca.region != cb.region:
                raise ValueError(f"clusters {ca.id} and {cb.id} are not in one region")
            rate = cm.bytes_per_s(link.bandwidth_gbps, cm.link_goodput(ca.region, cb.region, calibration))
            rates.append(rate / (max(shares[ca.id], shares[cb.id], 1) * tp))
            lats.append(link.latency_ms / 1000.0)
        latency.append(max(lats))
        link_bw.append(min(rates))
    has_link = any(math.isfinite(x) for x in link_bw)
    return cm.PipelineLinks(
        ports, ports, tuple(across), tuple(latency), local_bw, tuple(link_bw) if has_link else ()
    )


def cluster_order(clusters: Sequence[tuple[str, int]]) -> list[str]:
    """Clusters of one region in the order a cross-cluster replica takes their nodes: most free
    devices first, so a replica's stages stay in as few clusters as can hold it and cross the
    region's link at as few boundaries as it can (each cluster's nodes contiguous, one crossing
    per change of cluster)."""
    return [c for c, _ in sorted(clusters, key=lambda e: (-e[1], e[0]))]
