"""The every-step gradient all-reduce of a torchrun group whose replicas hold one stage on several
nodes: each (stage, tp rank)'s ring crosses those nodes' own ports, not the cluster's fabric.

Inside a group the worker reduces each stage's gradients over the devices holding that stage in
every replica of the group (DDP or FSDP over the group's data-parallel dimension,
``training.parallel.dims``). Torchrun numbers a group's ranks node by node, so such a ring visits
a node's devices one after another and crosses into the next node once per node: with two nodes
or more its slowest hop is the slowest of their ports (``ClusterInfo.port``; each device has its
own, so the rings of several tp ranks or stages do not share one), at the larger latency. A ring
whose nodes lie in two clusters also crosses the region's local link, or the link between their
regions. A ring on one node runs over the node's own interconnect, priced at the cluster's fabric
as before. Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from contracts.errors import InvalidArgument
from control_layer.planner import cost_model as cm
from control_layer.planner.links import port_bytes_per_s
from control_layer.planner.placement import Placement
from control_layer.planner.replicas import Participant, Replica

StageRing = tuple[float, float]  # (bytes/s of the ring's slowest hop, its one-way seconds)


def _ring_links(placement: Placement, nodes_of_ring: set[str], cluster_of: dict[str, str]) -> StageRing:
    """The slowest hop of a ring over devices on these nodes (two or more)."""
    snapshot, calibration = placement.snapshot, placement.calibration
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    bw, lat = float("inf"), 0.0
    for n in nodes_of_ring:
        cluster = clusters[cluster_of[n]]
        gbps, lat_ms = cluster.port(nodes[n])
        bw = min(bw, port_bytes_per_s(cluster, gbps, calibration))
        lat = max(lat, lat_ms / 1000.0)
    regions = sorted({clusters[cluster_of[n]].region for n in nodes_of_ring})
    if len({cluster_of[n] for n in nodes_of_ring}) > 1:
        # Across clusters: the region's local link, or the slowest link between its regions.
        pairs = [(a, b) for a in regions for b in regions if a != b] or [(regions[0], regions[0])]
        for a, b in pairs:
            link = snapshot.link(a, b)
            if link is None:
                raise InvalidArgument(f"no link from region {a!r} to {b!r}", regions=[a, b])
            goodput = cm.link_goodput(a, b, calibration, measured=a != b and link.source == "measured")
            bw = min(bw, cm.bytes_per_s(link.bandwidth_gbps, goodput))
            lat = max(lat, link.latency_ms / 1000.0)
    return bw, lat


def group_rings(
    placement: Placement, replicas: Sequence[Replica], group_size: dict[Participant, int]
) -> dict[Participant, tuple[StageRing | None, ...]]:
    """Per group of two or more replicas where some stage's ring crosses nodes: per stage, its
    ring's slowest hop (the slowest of its tp ranks' rings), None where every tp rank's ring of
    that stage stays on one node. Groups whose rings all stay on a node are left out."""
    ranks: dict[Participant, set[int]] = defaultdict(set)
    on_nodes: dict[Participant, set[str]] = defaultdict(set)
    for rep in replicas:
        if group_size[rep.participant] >= 2:
            ranks[rep.participant].add(rep.rank)
            on_nodes[rep.participant].update(rep.all_nodes)
    if all(len(on) == 1 for on in on_nodes.values()):
        return {}  # every group on one node: the fabric's ring, as before
    group_of = {rank: p for p, rs in ranks.items() for rank in rs if len(on_nodes[p]) > 1}
    ring_nodes: dict[tuple[Participant, int, int], set[str]] = defaultdict(set)
    cluster_of: dict[str, str] = {}
    for t in placement.tasks:
        p = group_of.get(t.dp_rank)
        if p is not None:
            ring_nodes[(p, t.pp_stage, t.tp_rank)].add(t.node)
            cluster_of[t.node] = t.cluster
    out: dict[Participant, list[StageRing | None]] = {
        p: [None] * placement.pp for p in set(group_of.values())
    }
    for (p, stage, _), on in ring_nodes.items():
        if len(on) < 2:
            continue
        bw, lat = _ring_links(placement, on, cluster_of)
        was = out[p][stage]
        out[p][stage] = (bw, lat) if was is None else (min(was[0], bw), max(was[1], lat))
    return {p: tuple(rings) for p, rings in out.items() if any(r is not None for r in rings)}


def group_dp_comm_s(
    placement: Placement, replicas_in_group: int, rings: Sequence[StageRing | None], fabric: StageRing
) -> float:
    """The group's gradient all-reduce per step: every stage's rings run at once, each over its
    own hop (``fabric`` where it stays on a node), each moving its own stage's gradients
    (``cm.stage_param_counts``); the step waits for the last."""
    spec, tp, zero = placement.spec, placement.tp, placement.zero
    counts = cm.stage_param_counts(spec.model, placement.pp)
    worst = 0.0
    for stage, ring in enumerate(rings):
        bw, lat = fabric if ring is None else ring
        grad_bytes = counts[stage] / tp * cm.GRAD_BYTES
        worst = max(worst, cm.grad_ring_s(replicas_in_group, grad_bytes, bw, lat, zero))
    return worst
