"""Options whose replicas span nodes (of one cluster, or of one region's clusters that allow it), for a job
no single node can hold a replica of.

The search keeps a replica on one node. When that leaves nothing (a model that needs more devices
per replica than any node has free), this places each replica on whole nodes of one cluster: a
stage's tensor group on one node, consecutive stages on one node or the next, a node given to one
replica only, so every replica is its own torchrun group with one block of ranks per node
(``node_groups``). A cluster's nodes are taken fastest port first (``ClusterInfo.port``: a node's
declared fabric figures narrow the cluster's), so the first replicas get the fast nodes and each
replica's stages run down its nodes in falling port speed: a boundary between two nodes runs at the
slower port, so this order makes every boundary as fast as any order can (the fastest node is
never the slower end of a boundary) and keeps slow nodes out of the fast replicas. Ties keep the
order the pools list. (A replica that must take slow nodes can walk faster with them at the
pipeline's ends; that order is not searched.) Where the clusters hold fewer replicas than a
layout needs, the nodes left whose agents declared their group endpoint reachable from the
region's other clusters (``NodeInfo.cross_cluster_groups``) form replicas across clusters of one
region: a cluster's nodes together, clusters with the most free devices first, so a replica
crosses the region's link at as few stage boundaries as it can (``cross_cluster``). Every placement
is priced by ``estimate_planned``, exactly as the search's. Pure.
"""

from __future__ import annotations

from collections import defaultdict

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.candidates import Degrees, enumerate_degrees
from control_layer.planner.cross_cluster import cluster_order, reachable_nodes
from control_layer.planner.estimate import Links, estimate_planned, n_micro_batches
from control_layer.planner.fleet import Pool
from control_layer.planner.options import plan_id, qos_checks
from control_layer.planner.plan_types import Calibration, PlannedTask, PlanOption, SyncTopology
from control_layer.planner.quality import quality
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.topology import cluster_gossip, order_ring

# Layouts (dp, tp, pp at the lowest ZeRO stage) tried, smallest replicas first: each costs up to
# two estimates, and larger counts cost a fallback quote more than the search's own quotes take
# (BENCHMARKS.md, "Planner: spanning layouts").
MAX_DEGREES = 12

Slot = tuple[str, str, int]  # cluster id, node id, device index

Entry = tuple[str, str, tuple[int, ...]]  # cluster id, node id, its free devices
Group = tuple[str, str, list[Entry]]  # cluster id, device model, its nodes in the order replicas take them


def _groups(pools: list[Pool], snapshot: ResourceSnapshot) -> list[Group]:
    """Each (cluster, device model)'s nodes, fastest fabric port first (then lowest latency),
    sorted by cluster id and model: built once per quote."""
    by_cluster: dict[tuple[str, str], list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for p in pools:
        by_cluster[(p.cluster.id, p.model)] += list(p.nodes)
    clusters, nodes_by_id = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    out: list[Group] = []
    for (cid, model), nodes in sorted(by_cluster.items()):
        ports = {n: clusters[cid].port(nodes_by_id[n]) for n, _ in nodes}
        ordered = sorted(nodes, key=lambda e: (-ports[e[0]][0], ports[e[0]][1]))
        out.append((cid, model, [(cid, n, free) for n, free in ordered]))
    return out


def _cross_groups(
    groups: list[Group], used: set[str], reachable: frozenset[str], region_of: dict[str, str]
) -> list[Group]:
    """Per (region, device model), the nodes no one-cluster replica took whose agents declared
    their group endpoint reachable from other clusters, a cluster's nodes together in their own
    order, clusters by ``cluster_order``; only where two clusters or more have such nodes."""
    by_region: dict[tuple[str, str], dict[str, list[Entry]]] = defaultdict(dict)
    for cid, model, entries in groups:
        left = [e for e in entries if e[1] in reachable and e[1] not in used]
        if left:
            by_region[(region_of[cid], model)][cid] = left
    out: list[Group] = []
    for (region, model), per_cluster in sorted(by_region.items()):
        if len(per_cluster) < 2:
            continue
        order = cluster_order([(c, sum(len(e[2]) for e in es)) for c, es in per_cluster.items()])
        out.append((region, model, [e for c in order for e in per_cluster[c]]))
    return out


def _replicas(groups: list[Group], tp: int, pp: int, need: int) -> list[list[Slot]]:
    """The first ``need`` replica device lists in (stage, tp rank) order, group by group, each on
    whole nodes of one group (fewer when the groups hold fewer)."""
    out: list[list[Slot]] = []
    for _, _, nodes in groups:
        current: list[Slot] = []
        for cid, node, free in nodes:
            per_node = len(free) // tp  # whole stages this node can hold
            if per_node == 0:
                continue
            take = min(per_node, pp - len(current) // tp)
            current += [(cid, node, d) for d in free[: take * tp]]
            if len(current) == tp * pp:
                out.append(current)
                current = []
                if len(out) == need:
                    return out
    return out


def _tasks(replicas: list[list[Slot]], tp: int, regions: dict[str, str]) -> list[PlannedTask]:
    # Built from the snapshot's own ids and indices, validated when it was: constructed directly.
    return [
        PlannedTask.model_construct(
            dp_rank=r, pp_stage=i // tp, tp_rank=i % tp, cluster=c, node=n, device=d, region=regions[c]
        )
        for r, devices in enumerate(replicas)
        for i, (c, n, d) in enumerate(devices)
    ]


def spanning_options(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    pools: list[Pool],
    calibration: Calibration | None,
) -> list[PlanOption]:
    """Priced options with replicas across nodes (possibly none): per degrees, the replicas on the
    cheapest devices and on the fastest ones."""
    total = sum(p.n_free for p in pools)
    degrees, _, _ = enumerate_degrees(spec, total, total)
    widest = max((len(ix) for p in pools for _, ix in p.nodes), default=0)
    roomiest = max((p.memory_gb for p in pools), default=0.0)
    # Only what the search could not place: a replica larger than every node, tp within a node;
    # and only layouts that fit the roomiest device as the estimate sizes them (its micro-batches;
    # no ZeRO shard group, each replica here being a torchrun group of its own). Most layouts of a
    # job that reaches here fit nowhere: they must not crowd out those that do. Without a shard
    # group a higher ZeRO stage never helps (stages 1-2 change nothing, stage 3 only adds its
    # gathered layers), so only the lowest stage the spec allows is tried: its copies would take
    # the places of distinct layouts.
    lowest = min((d.zero for d in degrees), default=0)
    wanted = sorted(
        (
            d
            for d in degrees
            if d.zero == lowest
            and d.tp <= widest < d.tp * d.pp
            and cm.fits(
                cm.memory_per_device(
                    spec, d.tp, d.pp, d.zero, 1, n_micro_batches(spec, d.dp), spec.pp_schedule
                ).total,
                roomiest,
            )
        ),
        key=lambda d: (d.tp * d.pp, d.dp, d.tp, d.zero),
    )[:MAX_DEGREES]
    clusters = snapshot.clusters_by_id()
    regions = {c.id: c.region for c in snapshot.clusters}
    price = {p.cluster.id: p.price for p in pools}
    speed = {p.cluster.id: p.tflops for p in pools}
    groups = _groups(pools, snapshot)
    # The cheapest clusters first, then the fastest; a stable order, so a cluster's replicas keep
    # theirs. Taking the first dp replicas in that order is the dp best of all of them.
    orders = [
        sorted(groups, key=lambda g: (price[g[0]], g[0])),
        sorted(groups, key=lambda g: (-speed[g[0]], g[0])),
    ]
    reachable = reachable_nodes(snapshot)
    out: dict[str, PlanOption] = {}
    for deg in wanted:
        picked: list[list[list[Slot]]] = []
        for ordered in orders:
            chosen = _replicas(ordered, deg.tp, deg.pp, deg.dp)
            if len(chosen) < deg.dp and reachable:
                # What no cluster holds alone: replicas across clusters of a region, from the
                # nodes left that declared their group endpoint reachable from other clusters.
                used = {n for r in chosen for _, n, _ in r}
                cross = _cross_groups(ordered, used, reachable, regions)
                chosen += _replicas(cross, deg.tp, deg.pp, deg.dp - len(chosen))
            if len(chosen) < deg.dp:
                break  # too few replicas in the whole fleet, whatever the order
            if chosen in picked:
                continue  # the cheapest devices are the fastest too: priced once
            picked.append(chosen)
            option = _option(spec, snapshot, deg, _tasks(chosen, deg.tp, regions), calibration, clusters)
            if option is not None:
                out[option.id] = option
    return list(out.values())


def _option(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    deg: Degrees,
    tasks: list[PlannedTask],
    calibration: Calibration | None,
    clusters: dict,
) -> PlanOption | None:
    spot = spec.qos.preemptible and any(
        (s := clusters[t.cluster].spot_price_per_device_hour) is not None
        and s < clusters[t.cluster].price_per_device_hour
        for t in tasks
    )
    try:
        est, runtime = estimate_planned(
            spec,
            snapshot,
            tasks,
            dp=deg.dp,
            tp=deg.tp,
            pp=deg.pp,
            zero=deg.zero,
            pp_schedule=spec.pp_schedule,
            spot=spot,
            calibration=calibration,
        )
    except InvalidArgument:  # out of memory on these devices: not an option
        return None
    checks = qos_checks(spec, snapshot, tasks, est, spot)
    if not all(c.ok for c in checks):
        return None
    links = Links(snapshot, calibration)
    region_ring = order_ring(sorted({t.region for t in tasks}), links.bw, links.lat)
    pos = {r: i for i, r in enumerate(region_ring)}
    # The clusters of the sync participants: a torchrun group's first node (its first stage) leads it.
    ring = sorted(
        {t.cluster for t in tasks if t.pp_stage == 0 and t.tp_rank == 0},
        key=lambda c: (pos[clusters[c].region], c),
    )
    gossip: dict[str, list[str]] = {}
    if spec.sync.mode == "gossip":
        # As the search's options have it (``assign``).
        gossip = cluster_gossip(
            ring, lambda c: clusters[c].region, region_ring, spec.sync.gossip_peers, links.bw
        )
    every = cm.sync_every(spec.sync)
    q = quality(spec.sync.mode, every, spec.sync.compression, overlap=runtime.overlap)
    sync = SyncTopology(
        mode=spec.sync.mode,
        ring=ring,
        gossip=gossip,
        compression=spec.sync.compression,
        every=every,
        loss_ratio=None if q is None else q.loss_ratio,
        loss_ratio_basis="" if q is None else q.measured_as,
    )
    per_cluster: dict[str, int] = defaultdict(int)
    for t in tasks:
        if t.pp_stage == 0 and t.tp_rank == 0:
            per_cluster[t.cluster] += 1
    return PlanOption(
        id=plan_id(spec, deg.dp, deg.tp, deg.pp, deg.zero, spot, tasks),
        dp=deg.dp,
        tp=deg.tp,
        pp=deg.pp,
        zero=deg.zero,
        pp_schedule=spec.pp_schedule,
        micro_batch_size=spec.training.micro_batch_size,
        n_micro_batches=n_micro_batches(spec, deg.dp),
        spot=spot,
        precision=spec.training.precision,
        activation_checkpointing=spec.training.activation_checkpointing,
        replicas_per_cluster=dict(sorted(per_cluster.items())),
        tasks=tasks,
        sync=sync,
        runtime=runtime,
        estimates=est,
        qos_checks=checks,
        regions=region_ring,
    )
