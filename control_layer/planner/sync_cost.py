"""One cross-participant exchange of an option, priced: the flat ring, the hierarchical exchange
and per-stage rings (docs/cost-model.md, "Cross-cluster synchronisation" with its "Per-stage
rings" and "Hierarchical exchange", where the symbols are defined)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.links import Links, port_bytes_per_s
from control_layer.planner.node_groups import node_groups, per_stage_sync, stage_leaders
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import ExchangeBasis, PlannedTask
from control_layer.planner.replicas import Participant
from control_layer.planner.snapshot import ResourceSnapshot

StageLeader = tuple[str, str, str]  # (region, cluster id, node id) of a group's leader of one stage
Pipe = tuple[tuple[str, ...], float]  # (what carries the bytes, its bytes/s)


@dataclass(frozen=True)
class SyncCost:
    t_sync: float  # seconds per exchange
    egress_usd: float  # USD per exchange
    wan_bytes: float  # bytes crossing region boundaries per exchange
    basis: ExchangeBasis = field(default_factory=ExchangeBasis)  # the exchange's parts, for calibration


NO_EXCHANGE = SyncCost(0.0, 0.0, 0.0, ExchangeBasis())


@dataclass
class SlowestHop:
    """The slowest of a set of hops, field by field: the least bytes/s, the largest seconds a hop
    pays (its latency and half a call's fixed cost at the leaders' share), the largest latency
    alone and the largest call's fixed cost per idle core."""

    bytes_per_s: float = math.inf
    hop_s: float = 0.0
    latency_s: float = 0.0
    call_s: float = 0.0

    def add(self, bytes_per_s: float, hop_s: float, latency_s: float, call_s: float) -> None:
        self.bytes_per_s = min(self.bytes_per_s, bytes_per_s)
        self.hop_s = max(self.hop_s, hop_s)
        self.latency_s = max(self.latency_s, latency_s)
        self.call_s = max(self.call_s, call_s)

    def add_all(self, other: SlowestHop) -> None:
        self.add(other.bytes_per_s, other.hop_s, other.latency_s, other.call_s)


@dataclass(frozen=True)
class ExchangeWork:
    """The exchange's fixed cost and the leaders' per-parameter work, paid once per exchange:
    learned per region pair from cross-region exchanges (``exchange_fit``); the runtime does the
    same work whichever link the exchange crosses."""

    fixed_s: float
    param_s: float
    params: float
    share: float  # the slowest leader's host share, at least 1

    @classmethod
    def of(cls, regions: list[str], links: Links, params: float) -> ExchangeWork:
        fixed_s = cm.exchange_fixed_seconds(regions, links.calibration)
        param_s = cm.exchange_param_seconds(regions, links.calibration)
        return cls(fixed_s, param_s, params, max(1.0, links.call_share))

    @property
    def seconds(self) -> float:
        return (self.fixed_s + self.params * self.param_s) * self.share


def _egress_usd(links: Links, regions: Sequence[str], bytes_each: float) -> float:
    """USD of an exchange in which each region's participant sends ``bytes_each``, billed at its
    dearest link to the others (what it pays whichever peer the ring or gossip puts next)."""
    return sum(bytes_each / cm.GB * max(links.egress(a, b) for b in regions if b != a) for a in regions)


def _link_between(links: Links, a: str, b: str) -> float:
    """The slower direction's bytes/s between two regions; raises where either has no link."""
    bw = min(links.bw(a, b), links.bw(b, a))
    if bw <= 0:
        raise InvalidArgument(f"no link between regions {a!r} and {b!r}", regions=[a, b])
    return bw


def _between_regions(links: Links, regions: list[str]) -> SlowestHop:
    """The slowest link and the largest latency of any pair of the regions."""
    outer = SlowestHop()
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            bw = _link_between(links, a, b)
            lat = max(links.lat(a, b), links.lat(b, a))
            latency = max(links.link_lat(a, b), links.link_lat(b, a))
            outer.add(bw, lat, latency, max(links.call_s(a, b), links.call_s(b, a)))
    return outer


def _within_regions(
    spec: JobSpec,
    links: Links,
    by_region: dict[str, dict[str, int]],
    fabric: dict[str, tuple[float, float]],
) -> tuple[SlowestHop, float]:
    """The slowest hop inside any region (a cluster's fabric between two of its nodes, the
    region's local link between two of its clusters), and the slowest region's gather into its
    head as the hierarchical exchange runs it."""
    inner = SlowestHop()
    gather_s = 0.0
    for r in sorted(by_region):
        call = links.call_s(r, r)
        here = SlowestHop()
        for cluster, count in by_region[r].items():
            if count >= 2:
                bw, latency = fabric[cluster]
                here.add(bw, latency + call * links.call_share / 2.0, latency, call)
        if len(by_region[r]) >= 2:
            here.add(links.bw(r, r), links.lat(r, r), links.link_lat(r, r), call)
        if math.isfinite(here.bytes_per_s):
            inner.add_all(here)
            m = sum(by_region[r].values())
            n = float(spec.model.n_params)
            gather_s = max(gather_s, float(cm.region_gather_s(spec.sync, n, m, here.bytes_per_s, here.hop_s)))
    return inner, gather_s


def _hierarchical(
    spec: JobSpec,
    links: Links,
    regions: list[str],
    outer: SlowestHop,
    local_s: float,
    wan_s: float,
    work: ExchangeWork,
) -> SyncCost:
    """Members to their region's head, the heads' ring over the WAN, the result back."""
    groups, n = len(regions), float(spec.model.n_params)
    per_head = float(cm.wan_bytes_per_leader(spec.sync, n, groups))
    basis = ExchangeBasis(
        local_s=local_s,
        bytes=per_head,
        bytes_per_s=outer.bytes_per_s,
        latency_s=4.0 * (groups - 1) * outer.latency_s,
        rounds=2 * (groups - 1),
        call_s=outer.call_s,
        fixed_s=work.fixed_s,
        params=n,
        param_s=work.param_s,
        share=work.share,
        hierarchical=True,
    )
    return SyncCost(
        local_s + wan_s + work.seconds, _egress_usd(links, regions, per_head), per_head * groups, basis
    )


def _flat_ring(
    spec: JobSpec,
    links: Links,
    regions: list[str],
    p_count: int,
    ring_s: float,
    slowest: SlowestHop,
    work: ExchangeWork,
) -> SyncCost:
    """Every participant in one ring: its bytes over the slowest hop, a round trip per call."""
    sync, n = spec.sync, float(spec.model.n_params)
    per_participant = float(cm.wan_bytes_per_leader(sync, n, p_count))
    egress, crossing = 0.0, 0.0
    if len(regions) >= 2:
        egress = _egress_usd(links, regions, per_participant)
        crossing = per_participant * len(regions)
    basis = ExchangeBasis(
        bytes=float(cm.wan_time_factor(sync, n, p_count)),
        bytes_per_s=slowest.bytes_per_s,
        latency_s=float(cm.wan_latency_hops(sync, p_count)) * slowest.latency_s,
        rounds=cm.exchange_rounds(sync, p_count),
        call_s=slowest.call_s,
        fixed_s=work.fixed_s,
        params=n,
        param_s=work.param_s,
        share=work.share,
    )
    return SyncCost(ring_s + work.seconds, egress, crossing, basis)


def sync_cost(
    spec: JobSpec,
    links: Links,
    participants: Sequence[tuple[str, str]],
    fabric: dict[str, tuple[float, float]],
) -> SyncCost:
    """One exchange among the job's sync participants, one per node: (region, cluster id) each.

    The runtime rings over every participant (``training.sync.collective``; the control plane's
    ring keeps a cluster's nodes and a region's clusters together, ``assign``), so the ring's
    hops are: between two nodes of one cluster, the cluster's fabric (``fabric``: cluster id ->
    (bytes/s, one-way s)); between two clusters of one region, the region's local link; between
    regions, the link between them. The bytes cross the slowest hop and every call pays a round
    trip on the slowest (``cm.ring_sync_s``). Between regions the slowest link and largest
    latency of any pair are taken, which holds for every ring order, including the ring re-formed
    after a region drops out. Every hop's latency carries half a call's fixed cost, per idle core
    times the leaders' host share (``Links.lat``; the calls are CPU work on both ends). Each
    region's egress is what one participant sends, priced at its dearest link to another region.
    The exchange's fixed cost and the leaders' per-parameter work are added once per exchange
    (``cm.exchange_fixed_seconds``, ``cm.exchange_param_seconds``, times the host share).

    Where it is faster (``cm.hierarchical_pays``), the exchange is the hierarchical one instead
    (``cm.hierarchical_parts``: every region's members to its head over that region's slowest
    hop, the heads' ring over the slowest link between regions, the answers back), and the
    basis says so (``ExchangeBasis.hierarchical``).
    """
    p_count = len(participants)
    if p_count < 2:
        return NO_EXCHANGE
    by_region: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for region, cluster in participants:
        by_region[region][cluster] += 1
    regions = sorted(by_region)
    # The hops inside the regions and between them, apart: the hierarchical exchange pays each
    # phase over its own.
    inner, gather_s = _within_regions(spec, links, by_region, fabric)
    outer = _between_regions(links, regions)
    slowest = SlowestHop()
    slowest.add_all(inner)
    slowest.add_all(outer)
    if slowest.bytes_per_s <= 0:
        raise InvalidArgument(f"no local link in region(s) {regions}", regions=regions)
    sync, n = spec.sync, float(spec.model.n_params)
    ring_s = float(cm.ring_sync_s(sync, n, p_count, slowest.bytes_per_s, slowest.hop_s))
    work = ExchangeWork.of(regions, links, n)
    groups, largest = len(regions), max(sum(counts.values()) for counts in by_region.values())
    local_s, wan_s = (0.0, 0.0)
    if groups >= 2 and largest >= 2:
        parts = cm.hierarchical_parts(sync, n, groups, gather_s, outer.bytes_per_s, outer.hop_s)
        local_s, wan_s = (float(v) for v in parts)
    if bool(cm.hierarchical_pays(sync, groups, largest, ring_s, local_s + wan_s)):
        return _hierarchical(spec, links, regions, outer, local_s, wan_s, work)
    return _flat_ring(spec, links, regions, p_count, ring_s, slowest, work)


@dataclass(frozen=True)
class _StageRing:
    """One stage's ring as it runs beside the others: the pipes it crosses and its slowest hop."""

    pipes: list[Pipe]
    participants: int
    slowest: SlowestHop  # hop_s, latency_s and call_s (bytes_per_s: see pipes)
    regions: list[str]
    params: float  # the stage's parameters
    pipe_bytes: float  # what the ring moves through each of its pipes (``cm.wan_time_factor``)


def _stage_ring(
    spec: JobSpec,
    links: Links,
    stage: int,
    ring: Sequence[StageLeader],
    ports: dict[str, tuple[float, float]],
    params: float,
) -> _StageRing | None:
    """Stage ``stage``'s ring of leaders: each leader's port, a region's local link where the ring
    spans its clusters, the link between each pair of its regions (None: fewer than two leaders)."""
    p_count = len(ring)
    if p_count < 2:
        return None
    by_region: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for region, cluster, node in ring:
        by_region[region][cluster].append(node)
    regions = sorted(by_region)
    pipes: list[Pipe] = []
    slowest = SlowestHop()
    for r in regions:
        call = links.call_s(r, r)
        for nodes_ in by_region[r].values():
            for node in nodes_:
                bw, latency = ports[node]
                pipes.append((("port", node, str(stage)), bw))
                if len(nodes_) >= 2:  # a hop over the cluster's fabric
                    slowest.add(math.inf, latency + call * links.call_share / 2.0, latency, call)
        if len(by_region[r]) >= 2:
            pipes.append((("local", r), links.bw(r, r)))
            slowest.add(math.inf, links.lat(r, r), links.link_lat(r, r), call)
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            pipes.append((("link", a, b), _link_between(links, a, b)))
            slowest.add(math.inf, links.lat(a, b), links.link_lat(a, b), links.call_s(a, b))
            slowest.add(math.inf, links.lat(b, a), links.link_lat(b, a), links.call_s(b, a))
    if any(bw <= 0 for _, bw in pipes):
        raise InvalidArgument(f"no local link in region(s) {regions}", regions=regions)
    moved = float(cm.wan_time_factor(spec.sync, params, p_count))
    return _StageRing(pipes, p_count, slowest, regions, params, moved)


def stage_sync_cost(
    spec: JobSpec,
    links: Links,
    rings: Sequence[Sequence[StageLeader]],
    ports: dict[str, tuple[float, float]],
    stage_params: Sequence[float],
) -> SyncCost:
    """One exchange as per-stage rings run it (``training.sync.stages``): ring s joins every
    group's leader of stage s and moves only that stage's ``stage_params[s]`` parameters, all
    rings at once. Each ring's hops are priced as ``sync_cost`` prices the one ring (a cluster's
    fabric through its leaders' ports, ``ports``: node -> (bytes/s, one-way s); the region's local
    link; the link between regions), and rings that cross one pipe share it: a pipe's time is the
    bytes of every ring through it over its rate (each node's port, each region's local link, each
    pair of regions' link, one direction: links are full duplex). A ring ends when its slowest pipe
    has carried everything through it, plus its calls; the exchange when the last ring ends. Every
    leader's bytes leave and enter through its device's port into the fabric (at its node's rate),
    one per stage leader even where a node leads several stages (a whole replica beside split
    ones: each stage's leader is its own device). Each stage leader does its own
    stage's per-parameter work beside the others: the exchange pays the fixed cost and the
    largest stage's work once. Egress and bytes across regions add up over the rings."""
    planned = [
        ring
        for stage, (leaders, n_s) in enumerate(zip(rings, stage_params, strict=True))
        if (ring := _stage_ring(spec, links, stage, leaders, ports, n_s)) is not None
    ]
    if not planned:
        return NO_EXCHANGE
    load: dict[tuple[str, ...], float] = defaultdict(float)  # bytes of every ring through a pipe
    for ring in planned:
        for key, _ in ring.pipes:
            load[key] += ring.pipe_bytes
    all_regions = sorted({r for ring in planned for r in ring.regions})
    work = ExchangeWork.of(all_regions, links, max(ring.params for ring in planned))
    sync = spec.sync
    t_max, basis = -1.0, None
    egress = crossing = 0.0
    for ring in planned:
        key, bw = max(ring.pipes, key=lambda kb: load[kb[0]] / kb[1])
        hops = float(cm.wan_latency_hops(sync, ring.participants))
        t = load[key] / bw + hops * ring.slowest.hop_s
        if t > t_max:  # the ring that ends last prices the exchange
            t_max = t
            basis = ExchangeBasis(
                bytes=load[key],
                bytes_per_s=bw,
                latency_s=hops * ring.slowest.latency_s,
                rounds=cm.exchange_rounds(sync, ring.participants),
                call_s=ring.slowest.call_s,
                fixed_s=work.fixed_s,
                params=work.params,
                param_s=work.param_s,
                share=work.share,
                rings=len(planned),
            )
        per_participant = float(cm.wan_bytes_per_leader(sync, ring.params, ring.participants))
        if len(ring.regions) >= 2:
            egress += _egress_usd(links, ring.regions, per_participant)
            crossing += per_participant * len(ring.regions)
    assert basis is not None
    return SyncCost(t_max + work.seconds, egress, crossing, basis)


def stage_rings(
    tasks: Sequence[PlannedTask], snapshot: ResourceSnapshot, groups: Sequence[Sequence[str]] | None = None
) -> list[list[StageLeader]]:
    """Per stage, every group's leader of it (``node_groups.stage_leader_nodes``), groups in order.
    ``groups``: ``node_groups(tasks)``, where the caller has them."""
    cluster_of = {t.node: t.cluster for t in tasks}
    clusters = snapshot.clusters_by_id()
    per_group = stage_leaders(tasks, node_groups(tasks) if groups is None else groups)
    return [
        [(clusters[cluster_of[n]].region, cluster_of[n], n) for n in (leaders[s] for leaders in per_group)]
        for s in range(len(per_group[0]))
    ]


def participant_fabric(
    placement: Placement, participants: Sequence[Participant]
) -> dict[str, tuple[float, float]]:
    """Per cluster, the (bytes/s, one-way s) a ring between its participants runs at: its slowest
    leader's port."""
    clusters, nodes = placement.snapshot.clusters_by_id(), placement.snapshot.nodes_by_id()
    fabric: dict[str, tuple[float, float]] = {}
    for cluster_id, leader, _ in participants:
        cluster = clusters[cluster_id]
        gbps, lat_ms = cluster.port(nodes[leader])
        bw_was, lat_was = fabric.get(cluster_id, (math.inf, 0.0))
        port_bw = port_bytes_per_s(cluster, gbps, placement.calibration)
        fabric[cluster_id] = (min(bw_was, port_bw), max(lat_was, lat_ms / 1000.0))
    return fabric


def exchange_cost(
    placement: Placement,
    participants: Sequence[Participant],
    shares: dict[str, float],
    links: Links,
    groups: Sequence[Sequence[str]] | None = None,
    may_split: bool = True,
) -> SyncCost:
    """The option's exchange: per-stage rings where the job's groups sync per stage
    (``node_groups.per_stage_sync``), else one ring (or hierarchy) over the participants.
    ``placement.spec`` is at the precision the option runs; ``groups``: the tasks' node groups,
    where the caller has them; ``may_split``: False where no replica spans nodes, so no group's
    stages sit on two nodes and nothing syncs per stage."""
    spec, snapshot, calibration = placement.spec, placement.snapshot, placement.calibration
    clusters = snapshot.clusters_by_id()
    if not may_split or not per_stage_sync(placement.tasks, spec.sync.mode, placement.pp, groups):
        regions_of = [(clusters[cluster_id].region, cluster_id) for cluster_id, _, _ in participants]
        return sync_cost(spec, links, regions_of, participant_fabric(placement, participants))
    # Each stage's leaders ring on their own (``training.sync.stages``); the calls run on every
    # stage leader's host, so the slowest of those hosts slows them.
    nodes = snapshot.nodes_by_id()
    rings = stage_rings(placement.tasks, snapshot, groups)
    leaders = {node for ring in rings for _, _, node in ring}
    stage_links = Links(snapshot, calibration, max(shares.get(node, 1.0) for node in leaders))
    ports = {
        node: (port_bytes_per_s(clusters[cluster_id], gbps, calibration), lat_ms / 1000.0)
        for ring in rings
        for _, cluster_id, node in ring
        for gbps, lat_ms in [clusters[cluster_id].port(nodes[node])]
    }
    return stage_sync_cost(spec, stage_links, rings, ports, cm.stage_param_counts(spec.model, placement.pp))
