"""Options whose replicas span nodes: of one cluster, or of clusters and regions whose nodes allow it.

The search keeps a replica on one node. When that leaves nothing (a model that needs more devices
per replica than any node has free), this places each replica on whole nodes of one cluster: a
stage's tensor group on one node, consecutive stages on one node or the next, a node given to one
replica only, so every replica is its own torchrun group with one block of ranks per node
(``node_groups``). A cluster's nodes are listed fastest port first (``ClusterInfo.port``: a node's
declared fabric figures narrow the cluster's; ties: more free devices, then the node's id, never
the order the fleet lists them in), and the first replicas taken in that order are priced beside
the replicas the grouping search forms from the cluster's nodes (``grouping``: which nodes form
each replica, with a bound on how far from the best grouping it can be), each replica's stages in
the order that walks fastest (``stage_order``). Where the clusters hold fewer replicas than a
layout needs, the nodes left whose agents declared their group endpoint reachable from other
clusters (``NodeInfo.cross_cluster_groups``) form replicas across clusters of one region (a
cluster's nodes together, clusters with the most free devices first: ``cross_cluster``), then
across regions (regions chained along fast links: ``cross_cluster.region_order``).

Wherever declared nodes of two clusters or more exist (``spans_clusters``), the cheapest and the
fastest declared devices are also pooled whatever their cluster and region, each replica's stages
laid region by region and cluster by cluster (``_contiguous``), so a pipeline through a cheap
region's devices, or through more devices than one region has, is priced too; and the search
weighs these options on its front against its own (``competing``) instead of offering them only
when it found none. Every placement is priced by ``estimate_planned``, exactly as the search's.
Pure.
"""

from __future__ import annotations

from collections import defaultdict

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.calibrated import quality_fields
from control_layer.planner.candidates import Degrees, enumerate_degrees
from control_layer.planner.cross_cluster import cluster_order, reachable_nodes, region_order
from control_layer.planner.estimate import estimate_planned
from control_layer.planner.fleet import Pool
from control_layer.planner.grouping import Entry as _Entry
from control_layer.planner.grouping import Grouping, Kind, Priced
from control_layer.planner.grouping import group as group_replicas
from control_layer.planner.links import Links
from control_layer.planner.listing import natural
from control_layer.planner.local_step import composition_walk, n_micro_batches, rate_key, replica_walks
from control_layer.planner.options import plan_id, qos_checks
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import (
    Calibration,
    GroupingBound,
    PlannedTask,
    PlanOption,
    Slot,
    SyncTopology,
    laid_out_tasks,
)
from control_layer.planner.replicas import Replica, replicas_on_slots
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.stage_order import Budget, best_order, search_orders, searchable
from control_layer.planner.topology import cluster_gossip, order_ring

# Layouts (dp, tp, pp at the lowest ZeRO stage) tried, smallest replicas first: each costs up to
# two estimates, and larger counts cost a fallback quote more than the search's own quotes take
# (BENCHMARKS.md at dabf7f7, "Planner: spanning layouts").
MAX_DEGREES = 12
# Beside the search's own options (``competing``), only the pooled placements of this many
# layouts are priced: a quote on a fleet whose every node declared itself reachable pays for
# each estimate (BENCHMARKS.md at dabf7f7, "Pipelines across regions").
COMPETING_DEGREES = 6

Entry = _Entry  # cluster id, node id, its free devices
Group = tuple[str, str, list[Entry]]  # cluster id, device model, its nodes in the order replicas take them


# Pool lists whose groups are kept per snapshot (QoS filters make a few distinct lists).
GROUPS_KEPT = 32


def _groups(pools: list[Pool], snapshot: ResourceSnapshot) -> list[Group]:
    """``_node_groups`` of the pools, kept with the snapshot per pool list: the snapshot keeps its
    pools across quotes, so the same filter yields the same Pool objects (checked by identity)."""
    cache: dict[tuple[int, ...], tuple[list[Pool], list[Group]]] = snapshot.derived(
        "spanning_groups", lambda _: {}
    )
    key = tuple(id(p) for p in pools)
    got = cache.get(key)
    if got is not None and all(a is b for a, b in zip(got[0], pools, strict=True)):
        return got[1]
    groups = _node_groups(pools, snapshot)
    if len(cache) >= GROUPS_KEPT:
        cache.pop(next(iter(list(cache))), None)  # list(): atomic under concurrent quotes
    cache[key] = (list(pools), groups)
    return groups


def _node_groups(pools: list[Pool], snapshot: ResourceSnapshot) -> list[Group]:
    """Each (cluster, device model)'s nodes, fastest fabric port first (then lowest latency, most
    free devices, id), sorted by cluster id and model."""
    by_cluster: dict[tuple[str, str], list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for p in pools:
        by_cluster[(p.cluster.id, p.model)] += list(p.nodes)
    clusters, nodes_by_id = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    out: list[Group] = []
    for (cid, model), nodes in sorted(by_cluster.items()):
        ports = {n: clusters[cid].port(nodes_by_id[n]) for n, _ in nodes}
        # Ties: the most free devices first (a node holding more stages keeps more boundaries
        # inside it), then by id: never the order the fleet happens to list its nodes in.
        ordered = sorted(nodes, key=lambda e: (-ports[e[0]][0], ports[e[0]][1], -len(e[1]), natural(e[0])))
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


def _cross_region_groups(
    groups: list[Group],
    used: set[str],
    reachable: frozenset[str],
    region_of: dict[str, str],
    snapshot: ResourceSnapshot,
) -> list[Group]:
    """Per device model, the declared nodes no replica took yet, across regions: a cluster's
    nodes together in their own order, a region's clusters by ``cluster_order``, the regions
    chained by ``region_order``; only where two regions or more have such nodes."""
    by_model: dict[str, dict[str, dict[str, list[Entry]]]] = defaultdict(lambda: defaultdict(dict))
    for cid, model, entries in groups:
        left = [e for e in entries if e[1] in reachable and e[1] not in used]
        if left:
            by_model[model][region_of[cid]][cid] = left
    out: list[Group] = []
    for model, per_region in sorted(by_model.items()):
        if len(per_region) < 2:
            continue
        free = {r: sum(len(e[2]) for es in cs.values() for e in es) for r, cs in per_region.items()}
        entries: list[Entry] = []
        for region in region_order(free, snapshot):
            per_cluster = per_region[region]
            order = cluster_order([(c, sum(len(e[2]) for e in es)) for c, es in per_cluster.items()])
            entries += [e for c in order for e in per_cluster[c]]
        out.append(("*", model, entries))
    return out


def _pooled(groups: list[Group], reachable: frozenset[str]) -> list[Group]:
    """The groups in their order, but per device model the declared nodes of every cluster pooled
    into one group, placed first (each cluster's nodes together, in the given order of clusters);
    what is left (undeclared nodes, a model declared in one cluster only) keeps its own group
    after them. ``_contiguous`` then lays each replica's stages region by region."""
    by_model: dict[str, list[Entry]] = defaultdict(list)
    clusters: dict[str, set[str]] = defaultdict(set)
    for cid, model, entries in groups:
        mine = [e for e in entries if e[1] in reachable]
        by_model[model] += mine
        if mine:
            clusters[model].add(cid)
    pooled = [("*", m, entries) for m, entries in by_model.items() if len(clusters[m]) >= 2]
    taken = {e[1] for _, _, entries in pooled for e in entries}
    rest = [(cid, model, [e for e in es if e[1] not in taken]) for cid, model, es in groups]
    return pooled + [g for g in rest if g[2]]


def _contiguous(replica: list[Slot], region_of: dict[str, str]) -> list[Slot]:
    """The replica's nodes (each a block of whole stages) reordered so that a region's nodes, and
    in it a cluster's, follow one another, in the order each first appears: the pipeline crosses
    between regions, and between clusters, as few times as its devices allow. Stable otherwise."""
    first = replica[0][0]
    if all(s[0] == first for s in replica):  # one cluster (most replicas): nothing to move
        return replica
    region_rank: dict[str, int] = {}
    cluster_rank: dict[str, int] = {}
    for cid, _, _ in replica:
        region_rank.setdefault(region_of[cid], len(region_rank))
        cluster_rank.setdefault(cid, len(cluster_rank))
    return sorted(replica, key=lambda s: (region_rank[region_of[s[0]]], cluster_rank[s[0]]))


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


class _Laid:
    """Per quote, each replica's tasks and what the estimate reads of it (``replicas_on_slots``),
    by its rank, tp and slots: layouts of one shape differ by how many replicas they take, the
    first on the same slots in each (``_replicas`` takes them in order), so each replica is laid
    out and read once a quote, not once per layout (a 70B quote's layouts take 16 to 256)."""

    def __init__(self, snapshot: ResourceSnapshot) -> None:
        self.snapshot = snapshot
        self.regions = snapshot.region_of()
        self._replicas: dict[tuple[int, int, tuple[Slot, ...]], Replica] = {}
        self._tasks: dict[tuple[int, int, tuple[Slot, ...]], list[PlannedTask]] = {}

    def tasks(self, placed: list[list[Slot]], tp: int) -> list[PlannedTask]:
        """The tasks of these replicas (laid out here from the snapshot's own figures, as
        ``assign`` lays out its own: not validated again)."""
        out: list[PlannedTask] = []
        for r, devices in enumerate(placed):
            key = (r, tp, tuple(devices))
            mine = self._tasks.get(key)
            if mine is None:
                rows = [
                    {
                        "dp_rank": r,
                        "pp_stage": i // tp,
                        "tp_rank": i % tp,
                        "cluster": c,
                        "node": n,
                        "device": d,
                        "region": self.regions[c],
                    }
                    for i, (c, n, d) in enumerate(devices)
                ]
                mine = self._tasks[key] = laid_out_tasks(rows)
            out += mine
        return out

    def replicas(self, placed: list[list[Slot]], deg: Degrees) -> list[Replica]:
        return replicas_on_slots(self.snapshot, placed, deg.tp, deg.pp, self._replicas)


def spans_clusters(pools: list[Pool], snapshot: ResourceSnapshot) -> bool:
    """Whether nodes of two clusters or more among these pools declared their group endpoint
    reachable from other clusters: only then can a replica cross clusters or regions, and
    spanning options compete with the search's instead of standing in for none."""
    reachable = reachable_nodes(snapshot)
    if not reachable:
        return False
    found: set[str] = set()
    for p in pools:  # stops at the second such cluster: asked several times a quote, over every pool
        if p.cluster.id not in found and any(n in reachable for n, _ in p.nodes):
            found.add(p.cluster.id)
            if len(found) >= 2:
                return True
    return False


def behind_own_ports(pools: list[Pool]) -> bool:
    """Whether some node declared a port into its cluster's fabric slower than the fabric (its own
    NIC): replicas on one node each then meet through the job's sync over those ports, and a
    replica across nodes (fewer of them, stage transfers inside fast nodes) may do better."""
    return any(p.port is not None and p.port[0] < p.cluster.intra_bandwidth_gbps for p in pools)


def spanning_competes(pools: list[Pool], snapshot: ResourceSnapshot) -> bool:
    """Whether spanning options are weighed on the front beside the search's own: where nodes of
    two clusters or more may share a replica, or nodes sit behind their own slower ports."""
    return spans_clusters(pools, snapshot) or behind_own_ports(pools)


def _wanted_degrees(
    spec: JobSpec, snapshot: ResourceSnapshot, pools: list[Pool], competing: bool
) -> list[Degrees]:
    """The layouts the search could not place: a replica larger than every node, tp within a node.
    Where declared nodes of several clusters may pool their devices, also a replica larger than
    the narrowest of them: nodes too narrow alone join others, across clusters and regions.

    And only layouts that fit the roomiest device as the estimate sizes them (its micro-batches;
    no ZeRO shard group, each replica here being a torchrun group of its own). Most layouts of a
    job that reaches here fit nowhere: they must not crowd out those that do. Without a shard
    group a higher ZeRO stage never helps (FSDP2 over a group of one shards nothing and keeps a
    gathered copy beside its own), so only the lowest stage the spec allows is tried: its copies
    would take the places of distinct layouts."""
    total = sum(p.n_free for p in pools)
    degrees, _, _ = enumerate_degrees(spec, total, total)
    widest = max((len(ix) for p in pools for _, ix in p.nodes), default=0)
    roomiest = max((p.memory_gb for p in pools), default=0.0)
    reachable = reachable_nodes(snapshot)
    lowest = min((d.zero for d in degrees), default=0)

    def wider_than(narrowest: int) -> list[Degrees]:
        return sorted(
            (
                d
                for d in degrees
                if d.zero == lowest
                and d.tp <= widest
                and narrowest < d.tp * d.pp
                and cm.fits(
                    cm.memory_per_device(
                        spec, d.tp, d.pp, d.zero, 1, n_micro_batches(spec, d.dp), spec.pp_schedule
                    ).total,
                    roomiest,
                )
            ),
            key=lambda d: (d.tp * d.pp, d.dp, d.tp, d.zero),
        )

    out: list[Degrees] = []
    if not competing:
        out = wider_than(widest)[:MAX_DEGREES]
    elif spans_clusters(pools, snapshot):
        declared = min(len(ix) for p in pools for n, ix in p.nodes if n in reachable)
        out = wider_than(declared)[:COMPETING_DEGREES]
    if behind_own_ports(pools):
        # Per replica shape, the most replicas that fit (the fewest stages per device), smallest
        # shapes first: a replica larger than the narrowest node joins nodes of the cluster
        # (also where the search found nothing: a layout it could not place may span nodes).
        most: dict[tuple[int, int], Degrees] = {}
        for d in wider_than(min(len(ix) for p in pools for _, ix in p.nodes)):
            most[(d.tp, d.pp)] = d  # ascending dp within a shape: the last is the largest
        out += [d for d in most.values() if d not in out][:MAX_DEGREES]
    return out


Order = tuple[list[Group], bool]  # (groups in the order replicas take them, whether pooled across clusters)


def _orders(
    snapshot: ResourceSnapshot, pools: list[Pool], groups: list[Group], competing: bool
) -> list[Order]:
    """The cheapest clusters first, then the fastest; a stable order, so a cluster's replicas keep
    theirs. Taking the first dp replicas in that order is the dp best of all of them."""
    price = {p.cluster.id: p.price for p in pools}
    speed = {p.cluster.id: p.tflops for p in pools}
    orders: list[Order] = (
        []
        if competing and not behind_own_ports(pools)
        else [
            (sorted(groups, key=lambda g: (price[g[0]], g[0])), False),
            (sorted(groups, key=lambda g: (-speed[g[0]], g[0])), False),
        ]
    )
    if spans_clusters(pools, snapshot):
        # Replicas across clusters and regions weighed against one-cluster ones: the cheapest and
        # the fastest declared devices pooled whatever their cluster (equal clusters: the one with
        # more free devices first, so a replica crosses as few boundaries as it can).
        reachable = reachable_nodes(snapshot)
        free: dict[str, int] = defaultdict(int)
        for p in pools:
            free[p.cluster.id] += p.n_free
        orders += [
            (_pooled(sorted(groups, key=lambda g: (price[g[0]], -free[g[0]], g[0])), reachable), True),
            (_pooled(sorted(groups, key=lambda g: (-speed[g[0]], -free[g[0]], g[0])), reachable), True),
        ]
    return orders


def _chosen(
    snapshot: ResourceSnapshot, deg: Degrees, ordered: list[Group], pooled: bool, regions: dict[str, str]
) -> list[list[Slot]] | None:
    """dp replicas in this order, their stages region by region, cluster by cluster; None where
    it holds too few. What no cluster holds alone: replicas across clusters of a region, from the
    nodes left that declared their group endpoint reachable from other clusters; then across
    regions, from what the regions leave."""
    reachable = reachable_nodes(snapshot)
    chosen = _replicas(ordered, deg.tp, deg.pp, deg.dp)
    if len(chosen) < deg.dp and reachable and not pooled:
        used = {n for r in chosen for _, n, _ in r}
        cross = _cross_groups(ordered, used, reachable, regions)
        chosen += _replicas(cross, deg.tp, deg.pp, deg.dp - len(chosen))
        if len(chosen) < deg.dp:
            used = {n for r in chosen for _, n, _ in r}
            wide = _cross_region_groups(ordered, used, reachable, regions, snapshot)
            chosen += _replicas(wide, deg.tp, deg.pp, deg.dp - len(chosen))
    if len(chosen) < deg.dp:
        return None  # too few replicas this way (another order may pool more)
    return [_contiguous(r, regions) for r in chosen]


def spanning_options(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    pools: list[Pool],
    calibration: Calibration | None,
    competing: bool = False,
) -> list[PlanOption]:
    """Priced options with replicas across nodes (possibly none): per degrees, the replicas on the
    cheapest devices and on the fastest ones, as listed (each cluster's nodes fastest port first)
    and as grouped by the search (``grouping``), each with its stages in the order that walks
    fastest. ``competing``: the search found options of its own, and these are weighed against
    them: replicas that pool declared nodes across clusters (and regions), for the first
    ``COMPETING_DEGREES`` layouts, and where nodes sit behind their own slower ports, the most
    replicas of each shape (``_wanted_degrees``)."""
    wanted = _wanted_degrees(spec, snapshot, pools, competing)
    clusters = snapshot.clusters_by_id()
    orders = _orders(snapshot, pools, _groups(pools, snapshot), competing)
    out: dict[str, PlanOption] = {}
    budget = Budget()  # the stage-order searches' share of this quote
    laid = _Laid(snapshot)
    for deg in wanted:
        picked: list[list[list[Slot]]] = []
        grouped: dict[str, Grouping | None] = {}  # per cluster: one search serves both orders
        for ordered, pooled in orders:
            placements = _placements(spec, laid, deg, ordered, pooled, calibration, budget, grouped)
            for placed, bound in placements:
                if placed in picked:
                    continue  # the cheapest devices are the fastest too: priced once
                picked.append(placed)
                option = _option(spec, laid, deg, placed, calibration, clusters)
                if option is not None:
                    out[option.id] = _bounded(option, bound)
    return list(out.values())


def option_on(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    deg: Degrees,
    placed: list[list[Slot]],
    calibration: Calibration | None = None,
) -> PlanOption | None:
    """The option a quote offers for exactly these replicas (a slot list each, in (stage, tp rank)
    order, each on nodes of its own), priced as spanning prices its own; None where it fits no
    device or fails a QoS bound."""
    return _option(spec, _Laid(snapshot), deg, placed, calibration, snapshot.clusters_by_id())


def _placements(
    spec: JobSpec,
    laid: _Laid,
    deg: Degrees,
    ordered: list[Group],
    pooled: bool,
    calibration: Calibration | None,
    budget: Budget,
    grouped: dict[str, Grouping | None],
) -> list[tuple[list[list[Slot]], Grouping | None]]:
    """The replicas of one order of clusters: as listed, with each replica's stages in the order
    that walks fastest (where that differs, priced beside the listed order, whose leaders may sit
    behind faster ports, or its boundaries on cheaper links: the front keeps what is better), and
    as the grouping search forms them from the first cluster alone, where it holds them all; each
    with the grouping's bound where its replicas lie in that one cluster."""
    snapshot, regions = laid.snapshot, laid.regions
    out: list[tuple[list[list[Slot]], Grouping | None]] = []
    chosen = _chosen(snapshot, deg, ordered, pooled, regions)
    first = ordered[0] if ordered and not pooled and ordered[0][0] in regions else None
    search = None
    if first is not None:
        if first[0] not in grouped:
            grouped[first[0]] = _grouping(spec, snapshot, deg, first, calibration, budget)
        search = grouped[first[0]]
    if search is not None and len(search.replicas) < deg.dp:
        search = None  # the first cluster alone holds too few: no bound over one cluster's nodes
    if chosen is not None:
        listed_bound = search if _within(chosen, first) else None
        out.append((chosen, listed_bound))
        searched = _searched(spec, laid, deg, chosen, calibration, budget)
        if searched is not None:
            out.append((searched, listed_bound))
    if search is not None:
        out.append((search.replicas, search))
    return out


def _within(replicas: list[list[Slot]], group: Group | None) -> bool:
    return group is not None and all(cid == group[0] for r in replicas for cid, _, _ in r)


def _grouping(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    deg: Degrees,
    group: Group,
    calibration: Calibration | None,
    budget: Budget,
) -> Grouping | None:
    """The grouping search (``grouping.group``) over one cluster's nodes: a node's kind is what
    the walk reads of it (its port, the stages it holds, its measured rate), and a composition
    is priced by its own walk at the order that walks fastest (``stage_order.best_order``)."""
    cid, _, entries = group
    cluster, nodes = snapshot.clusters_by_id()[cid], snapshot.nodes_by_id()
    precision = spec.training.precision
    base = _placement(spec, snapshot, deg, [], calibration)

    def kind_of(entry: Entry) -> Kind:
        node = nodes[entry[1]]
        gbps, lat_ms = cluster.port(node)
        rate = node.profile.rates.get(precision) if node.profile else None
        return (-gbps, lat_ms, -(len(entry[2]) // deg.tp), rate_key(rate) or ())

    def price(slots: list[Slot]) -> Priced:
        walk = composition_walk(base, slots, {})
        ordered = best_order(slots, deg.tp, walk, snapshot, calibration, budget, keep_head=deg.dp > 1)
        transfers = ordered.pp_comm_s
        if transfers is None:
            transfers = budget.pp_comm(walk, ordered.links) if ordered.links is not None else 0.0
        floor = walk.floor_s()
        return Priced(ordered.slots, floor + transfers, floor, ordered.exhaustive)

    # No replica here computes faster than on the fastest node's devices alone, transfers free.
    kinds = {kind_of(e): e for e in entries if len(e[2]) >= deg.tp}
    floor = min(
        (
            composition_walk(base, [(cid, n, free[0])] * (deg.tp * deg.pp), {}).floor_s()
            for _, n, free in kinds.values()
        ),
        default=0.0,
    )
    return group_replicas(entries, kind_of, deg.tp, deg.pp, deg.dp, price, floor)


def _bounded(option: PlanOption, search: Grouping | None) -> PlanOption:
    """The option with its grouping's bound: its slowest replica's step from compute to stage
    transfers as estimated, against the least any grouping of the same nodes can have."""
    if search is None:
        return option
    step = option.estimates.step_s
    slowest = step.compute + step.tp_comm + step.dp_comm + step.pp_bubble + step.pp_comm
    bound = min(search.lower_bound_s, slowest)
    gap = slowest / bound - 1.0 if bound > 0 else 0.0
    exact = search.exact and gap <= 1e-9
    return option.model_copy(
        update={
            "grouping": GroupingBound(
                slowest_replica_s=slowest,
                lower_bound_s=bound,
                gap=max(0.0, gap),
                exact=exact,
                compositions=search.compositions,
            )
        }
    )


def _searched(
    spec: JobSpec,
    laid: _Laid,
    deg: Degrees,
    chosen: list[list[Slot]],
    calibration: Calibration | None,
    budget: Budget,
) -> list[list[Slot]] | None:
    """The replicas with their stages in the order that walks fastest, or None where no replica
    has another order (one cluster, nodes alike) or none walks faster."""
    snapshot = laid.snapshot
    if not searchable(chosen, deg.tp, snapshot):
        return None
    try:
        replicas = laid.replicas(chosen, deg)
        tasks = laid.tasks(chosen, deg.tp)
        walks = replica_walks(_placement(spec, snapshot, deg, tasks, calibration), replicas)
    except InvalidArgument:  # not a placement the estimate accepts: nothing to order
        return None
    searched = search_orders(chosen, deg.tp, walks, snapshot, calibration, budget)
    return None if searched == chosen else searched


def _placement(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    deg: Degrees,
    tasks: list[PlannedTask],
    calibration: Calibration | None,
    spot: bool = False,
) -> Placement:
    """What the estimate prices: these tasks at the candidate's degrees."""
    return Placement(
        spec, snapshot, tasks, dp=deg.dp, tp=deg.tp, pp=deg.pp, zero=deg.zero,
        pp_schedule=spec.pp_schedule, spot=spot, calibration=calibration,
    )  # fmt: skip


def _option(
    spec: JobSpec,
    laid: _Laid,
    deg: Degrees,
    placed: list[list[Slot]],
    calibration: Calibration | None,
    clusters: dict,
) -> PlanOption | None:
    snapshot = laid.snapshot
    tasks = laid.tasks(placed, deg.tp)
    spot = spec.qos.preemptible and any(
        (s := clusters[t.cluster].spot_price_per_device_hour) is not None
        and s < clusters[t.cluster].price_per_device_hour
        for t in tasks
    )
    try:
        # Replicas and groups read from the slot lists the tasks were laid out from.
        replicas = laid.replicas(placed, deg)
        est, runtime = estimate_planned(
            _placement(spec, snapshot, deg, tasks, calibration, spot=spot),
            replicas,
            groups=[list(r.all_nodes) for r in replicas],
        )
    except InvalidArgument:  # out of memory on these devices, or not a group: not an option
        return None
    checks = qos_checks(spec, snapshot, tasks, est, spot)
    if not all(c.ok for c in checks):
        return None
    links = Links(snapshot, calibration)
    # The sync ring runs over the regions of the groups' leaders (a torchrun group's first node,
    # its first stage, leads it): a region that holds later stages only has no participant.
    leads = {t.region for t in tasks if t.pp_stage == 0 and t.tp_rank == 0}
    region_ring = order_ring(sorted(leads), links.bw, links.lat)
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
    s = spec.sync
    sync = SyncTopology(
        mode=s.mode,
        ring=ring,
        gossip=gossip,
        compression=s.compression,
        every=every,
        hierarchical=est.basis.exchange.hierarchical,
        **quality_fields(s.mode, every, str(s.compression), runtime.overlap, s.calibration),
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
        regions=region_ring + sorted({t.region for t in tasks} - leads),
    )
