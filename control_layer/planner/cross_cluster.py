"""Pipelines whose stages sit in two or more clusters, of one region or of several.

A node whose agent declared its torchrun endpoint reachable from other clusters
(``NodeInfo.cross_cluster_groups``) may share a replica with nodes there (``node_group_problems``).
A stage boundary between two clusters of one region leaves through the sender's fabric port,
crosses the region's local link (``ResourceSnapshot.link(region, region)``: the declared or probed
figure, else the snapshot's default local link), read as each cluster's port into the region's
network, one pipe per direction, and enters through the receiver's port; it pays the local link's
latency. The replicas whose boundaries cross out of (or into) one cluster at once share that
cluster's pipe. A boundary between regions crosses the link between them instead (one pipe per
direction, at the WAN goodput), shared by every replica crossing between the two regions, and pays
its latency; each activation sent forward and each gradient sent back is egress from its sender's
region (``wan_messages``). Pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from contracts.errors import InvalidArgument
from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import Calibration, PlannedTask
from control_layer.planner.snapshot import ClusterInfo, NodeInfo, ResourceSnapshot

Boundaries = tuple[tuple[tuple[str, str], ...], ...]  # per stage boundary, (sending, receiving) nodes


def private_between(snapshot: ResourceSnapshot, a: str, b: str) -> bool:
    """Whether a torchrun group may span a cluster of region a and one of region b (a == b: two
    clusters of one region, over its own network): the providers declared the link between them
    private, both ways. A group's gloo/NCCL traffic is plaintext; undeclared links are public."""
    there, back = snapshot.link(a, b), snapshot.link(b, a)
    return there is not None and back is not None and there.private and back.private


def _declared_by_region(snapshot: ResourceSnapshot) -> dict[str, dict[str, list[str]]]:
    """Per region, per cluster, the node ids that declared their group endpoint reachable from
    other clusters."""
    out: dict[str, dict[str, list[str]]] = {}
    for c in snapshot.clusters:
        ids = [n.id for n in c.nodes if n.cross_cluster_groups]
        if ids:
            out.setdefault(c.region, {})[c.id] = ids
    return out


def _reachable(snapshot: ResourceSnapshot) -> frozenset[str]:
    by_region = _declared_by_region(snapshot)
    out: set[str] = set()
    for region, clusters in by_region.items():
        partners = (len(clusters) >= 2 and private_between(snapshot, region, region)) or any(
            other != region and private_between(snapshot, region, other) for other in by_region
        )
        if partners:
            out.update(n for ids in clusters.values() for n in ids)
    return frozenset(out)


def declared_nodes(snapshot: ResourceSnapshot) -> frozenset[str]:
    """Node ids that declared their group endpoint reachable from other clusters, whatever the
    links (kept with the snapshot)."""
    return snapshot.derived(
        "cross_cluster_declared",
        lambda s: frozenset(n.id for c in s.clusters for n in c.nodes if n.cross_cluster_groups),
    )


def reachable_nodes(snapshot: ResourceSnapshot) -> frozenset[str]:
    """Node ids that declared their group endpoint reachable from other clusters, where another
    cluster with such nodes lies behind a private link (``private_between``): only these may share
    a group across clusters (kept with the snapshot)."""
    return snapshot.derived("cross_cluster_nodes", _reachable)


def public_crossings(
    snapshot: ResourceSnapshot, regions: Iterable[str] | None = None
) -> list[tuple[str, str]]:
    """The region pairs (a <= b; a == b: two clusters of one region) where nodes declared
    reachable from other clusters could share a group but for a link not declared private:
    what ``reachable_nodes`` leaves out, for a quote's reasons. ``regions``: only among these."""
    by_region = _declared_by_region(snapshot)
    names = sorted(set(by_region) & set(regions) if regions is not None else by_region)
    out = []
    for i, a in enumerate(names):
        if len(by_region[a]) >= 2 and not private_between(snapshot, a, a):
            out.append((a, a))
        out += [(a, b) for b in names[i + 1 :] if not private_between(snapshot, a, b)]
    return out


def node_clusters(snapshot: ResourceSnapshot) -> dict[str, ClusterInfo]:
    """Node id -> its cluster (kept with the snapshot)."""
    return snapshot.derived("node_clusters", lambda s: {n.id: c for c in s.clusters for n in c.nodes})


def crossing_pairs(
    boundaries: Boundaries, cluster_of: dict[str, ClusterInfo]
) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    """The ((cluster, region) sending, (cluster, region) receiving) pairs a replica's forward
    transfers cross."""
    return {
        ((cluster_of[a].id, cluster_of[a].region), (cluster_of[b].id, cluster_of[b].region))
        for pairs in boundaries
        for a, b in pairs
        if cluster_of[a].id != cluster_of[b].id
    }


def region_pipe(a: str, b: str) -> str:
    """The key under which ``pipe_shares`` counts the replicas crossing between regions a and b."""
    return f"{min(a, b)}|{max(a, b)}"


def pipe_shares(replica_boundaries: Iterable[Boundaries], cluster_of: dict[str, ClusterInfo]) -> Counter[str]:
    """Per cluster, how many replicas cross out of or into it within its region, and per pair of
    regions (``region_pipe``), how many cross between them: in lockstep their transfers meet on
    that pipe (max-min fair, an equal share each)."""
    shares: Counter[str] = Counter()
    for boundaries in replica_boundaries:
        pipes: set[str] = set()
        for (ca, ra), (cb, rb) in crossing_pairs(boundaries, cluster_of):
            pipes |= {ca, cb} if ra == rb else {region_pipe(ra, rb)}
        shares.update(pipes)
    return shares


def wan_messages(tasks: Iterable[PlannedTask], clusters: dict[str, ClusterInfo]) -> Counter[tuple[str, str]]:
    """Per (sending region, receiving region), the stage-to-stage messages of one micro-batch that
    cross between regions: each tp rank sends its activation forward to the same tp rank of the
    next stage, and the gradient comes back the other way (``torch.distributed.pipelining``)."""
    region = {(t.dp_rank, t.pp_stage, t.tp_rank): clusters[t.cluster].region for t in tasks}
    out: Counter[tuple[str, str]] = Counter()
    for (r, s, t), ra in region.items():
        rb = region.get((r, s + 1, t))
        if rb is not None and rb != ra:
            out[(ra, rb)] += 1
            out[(rb, ra)] += 1
    return out


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
    crosses the region's local link, or the link between the two regions, at the share of it each
    of its tp ranks' transfers gets (the ``shares`` replicas' tp ranks all send at once), and pays
    its latency."""

    seen: dict[str, tuple[float, float]] = {}

    def port(node_id: str) -> tuple[float, float]:
        got = seen.get(node_id)
        if got is None:
            c = cluster_of[node_id]
            gbps, lat_ms = c.port(nodes[node_id])
            got = cm.bytes_per_s(gbps, cm.link_goodput(c.region, c.region, calibration)), lat_ms / 1000.0
            seen[node_id] = got
        return got

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
            if ca.region == cb.region:
                rate, lat = _link(snapshot, ca.region, ca.region, calibration)
                sharing = max(shares[ca.id], shares[cb.id], 1)
            else:
                # Activations go one way and gradients the other, each on its own pipe: the
                # slower pipe and the longer latency hold both.
                there = _link(snapshot, ca.region, cb.region, calibration)
                back = _link(snapshot, cb.region, ca.region, calibration)
                rate, lat = min(there[0], back[0]), max(there[1], back[1])
                sharing = max(shares[region_pipe(ca.region, cb.region)], 1)
            rates.append(rate / (sharing * tp))
            lats.append(lat)
        latency.append(max(lats))
        link_bw.append(min(rates))
    has_link = any(math.isfinite(x) for x in link_bw)
    return cm.PipelineLinks(
        ports, ports, tuple(across), tuple(latency), local_bw, tuple(link_bw) if has_link else ()
    )


def _link(snapshot: ResourceSnapshot, a: str, b: str, calibration: Calibration | None) -> tuple[float, float]:
    """(bytes/s at the link's goodput, one-way seconds) from region a to b; refused where the
    snapshot knows no link (a pipeline across such regions cannot run)."""
    link = snapshot.link(a, b)
    if link is None:
        raise InvalidArgument(f"no link from region {a!r} to {b!r}", regions=[a, b])
    goodput = cm.link_goodput(a, b, calibration, measured=a != b and link.source == "measured")
    return cm.bytes_per_s(link.bandwidth_gbps, goodput), link.latency_ms / 1000.0


def cluster_order(clusters: Sequence[tuple[str, int]]) -> list[str]:
    """Clusters of one region in the order a cross-cluster replica takes their nodes: most free
    devices first, so a replica's stages stay in as few clusters as can hold it and cross the
    region's link at as few boundaries as it can (each cluster's nodes contiguous, one crossing
    per change of cluster)."""
    return [c for c, _ in sorted(clusters, key=lambda e: (-e[1], e[0]))]


def region_order(free: dict[str, int], snapshot: ResourceSnapshot) -> list[str]:
    """Regions in the order a replica across regions takes their nodes: the one with the most free
    devices first (a replica crosses out of it as late as it can), then each time the region
    with the fastest link both ways from the last one taken (ties: more free devices, then the
    name), so consecutive stages sit across fast links; regions linked to none taken come last."""

    def speed(a: str, b: str) -> float:
        there, back = snapshot.link(a, b), snapshot.link(b, a)
        return min(there.bandwidth_gbps, back.bandwidth_gbps) if there and back else 0.0

    left = sorted(free, key=lambda r: (-free[r], r))
    order = [left.pop(0)] if left else []
    while left:
        nxt = min(left, key=lambda r: (-speed(order[-1], r), -free[r], r))
        left.remove(nxt)
        order.append(nxt)
    return order
