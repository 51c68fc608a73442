"""Estimate a concrete placement (a task list): the single source of truth for an option's numbers.

The search evaluates the same formulas over whole clusters at once; this module evaluates them
for the devices actually chosen, and the orchestration layer can call it to re-price a plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from contracts.errors import InvalidArgument
from contracts.feasibility import resolve_precision
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.cross_cluster import (
    declared_nodes,
    node_clusters,
    pipe_shares,
    pipeline_links,
    private_between,
    wan_messages,
)
from control_layer.planner.intervals import basis, interval
from control_layer.planner.node_groups import (
    node_group_problems,
    node_groups,
    per_stage_sync,
    rank_key,
    stage_leader_nodes,
)
from control_layer.planner.plan_types import (
    Calibration,
    CostBreakdown,
    Estimates,
    ExchangeBasis,
    PlannedTask,
    RuntimeSettings,
    StepBreakdown,
)
from control_layer.planner.runtime_pricing import (
    drift_per_step,
    final_sync_s,
    overlapped_exchange_s,
    runtime_terms,
    wan_per_step,
)
from control_layer.planner.runtime_settings import settings_for, weakest_link
from control_layer.planner.snapshot import ClusterInfo, DeviceSlot, NodeInfo, ResourceSnapshot, StepRateInfo
from control_layer.planner.sync_choice import AutoSync, choice_for, provisional, with_every

# Key of the group of replicas that average gradients every step: the replicas on one node (one
# torchrun group) of one device model: (cluster id, node id, device model).
Participant = tuple[str, str, str]


def device_price(cluster: ClusterInfo, spot: bool) -> float:
    if spot and cluster.spot_price_per_device_hour is not None:
        return min(cluster.price_per_device_hour, cluster.spot_price_per_device_hour)
    return cluster.price_per_device_hour


def hourly_price(replicas: Sequence[Replica], spot: bool) -> float:
    """USD per hour of every device the replicas hold, each at its own cluster's price (a replica
    across clusters pays each cluster for its devices there)."""
    return sum(device_price(cluster, spot) for rep in replicas for cluster, _ in rep.devices)


def intra_bytes_per_s(cluster: ClusterInfo, calibration: Calibration | None) -> float:
    """The cluster fabric's achieved bandwidth (calibrated under the key "region|region")."""
    goodput = cm.link_goodput(cluster.region, cluster.region, calibration)
    return cm.bytes_per_s(cluster.intra_bandwidth_gbps, goodput)


def port_bytes_per_s(cluster: ClusterInfo, gbps: float, calibration: Calibration | None) -> float:
    """A node-level figure of the cluster's fabric, at the fabric's achieved fraction."""
    return cm.bytes_per_s(gbps, cm.link_goodput(cluster.region, cluster.region, calibration))


def n_micro_batches(spec: JobSpec, dp: int) -> int:
    per_replica = spec.global_batch_sequences // dp
    return max(1, per_replica // spec.training.micro_batch_size)


class Links:
    """Goodput-adjusted link numbers between regions, from a snapshot and a calibration (memoised).

    Between two regions ``lat`` is what one hop of an exchange call pays: the link's one-way
    latency plus half the call's fixed cost (``cm.exchange_call_seconds``, per idle core, times
    ``call_share``, the host share of the leaders), so the 2 hops of every call
    (``cm.wan_latency_hops``) add its round trip and its fixed cost. ``link_lat`` is the latency alone.
    """

    def __init__(
        self, snapshot: ResourceSnapshot, calibration: Calibration | None, call_share: float = 1.0
    ) -> None:
        self.snapshot = snapshot
        self.calibration = calibration
        self.call_share = call_share
        self._memo: dict[tuple[str, str], tuple[float, float, float, float]] = {}

    def _get(self, a: str, b: str) -> tuple[float, float, float, float]:
        got = self._memo.get((a, b))
        if got is None:
            ln = self.snapshot.link(a, b)
            if ln is None:
                got = (0.0, math.inf, 0.0, 0.0)
            else:
                goodput = cm.link_goodput(a, b, self.calibration, measured=ln.source == "measured")
                bw = cm.bytes_per_s(ln.bandwidth_gbps, goodput)
                # Every hop of an exchange is a call, also between two clusters of one region.
                call = cm.exchange_call_seconds([a, b], self.calibration)
                got = (bw, ln.latency_ms / 1000.0, ln.egress_price_per_gb, call)
            self._memo[(a, b)] = got
        return got

    def bw(self, a: str, b: str) -> float:
        """Bytes/s achieved from a to b; 0 when no link is known."""
        return self._get(a, b)[0]

    def lat(self, a: str, b: str) -> float:
        """Seconds one hop of an exchange call from a to b pays (latency and half the call's cost)."""
        got = self._get(a, b)
        return got[1] + got[3] * self.call_share / 2.0

    def link_lat(self, a: str, b: str) -> float:
        return self._get(a, b)[1]

    def call_s(self, a: str, b: str) -> float:
        """Fixed seconds of one exchange call between a and b, per idle core."""
        return self._get(a, b)[3]

    def egress(self, a: str, b: str) -> float:
        return self._get(a, b)[2]


@dataclass(frozen=True)
class SyncCost:
    t_sync: float  # seconds per exchange
    egress_usd: float  # USD per exchange
    wan_bytes: float  # bytes crossing region boundaries per exchange
    basis: ExchangeBasis = field(default_factory=ExchangeBasis)  # the exchange's parts, for calibration


def _egress_usd(links: Links, regions: Sequence[str], bytes_each: float) -> float:
    """USD of an exchange in which each region's participant sends ``bytes_each``, billed at its
    dearest link to the others (what it pays whichever peer the ring or gossip puts next)."""
    return sum(bytes_each / cm.GB * max(links.egress(a, b) for b in regions if b != a) for a in regions)


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
    sync, n = spec.sync, float(spec.model.n_params)
    p_count = len(participants)
    if p_count < 2:
        return SyncCost(0.0, 0.0, 0.0, ExchangeBasis())
    by_region: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for region, cluster in participants:
        by_region[region][cluster] += 1
    regions = sorted(by_region)
    # The hops inside the regions and between them, apart: the hierarchical exchange pays each
    # phase over its own.
    inner = [math.inf, 0.0, 0.0, 0.0]  # slowest bytes/s, largest hop seconds, latency, call
    outer = [math.inf, 0.0, 0.0, 0.0]

    def hop(at: list[float], bw: float, lat: float, latency: float, call: float) -> None:
        at[0], at[1] = min(at[0], bw), max(at[1], lat)
        at[2], at[3] = max(at[2], latency), max(at[3], call)

    gather_s = 0.0  # the slowest region's gather into its head (hierarchical)
    for r in regions:
        call = links.call_s(r, r)
        here = [math.inf, 0.0, 0.0, 0.0]
        for cluster, count in by_region[r].items():
            if count >= 2:
                bw, latency = fabric[cluster]
                hop(here, bw, latency + call * links.call_share / 2.0, latency, call)
        if len(by_region[r]) >= 2:
            hop(here, links.bw(r, r), links.lat(r, r), links.link_lat(r, r), call)
        if math.isfinite(here[0]):
            hop(inner, *here)
            m = sum(by_region[r].values())
            gather_s = max(gather_s, float(cm.region_gather_s(sync, n, m, here[0], here[1])))
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            bw = min(links.bw(a, b), links.bw(b, a))
            if bw <= 0:
                raise InvalidArgument(f"no link between regions {a!r} and {b!r}", regions=[a, b])
            lat = max(links.lat(a, b), links.lat(b, a))
            latency = max(links.link_lat(a, b), links.link_lat(b, a))
            hop(outer, bw, lat, latency, max(links.call_s(a, b), links.call_s(b, a)))
    bw_min, lat_max = min(inner[0], outer[0]), max(inner[1], outer[1])
    link_lat, call_max = max(inner[2], outer[2]), max(inner[3], outer[3])
    if bw_min <= 0:
        raise InvalidArgument(f"no local link in region(s) {regions}", regions=regions)
    t = float(cm.ring_sync_s(sync, n, p_count, bw_min, lat_max))
    # The exchange's fixed cost and the leaders' per-parameter work (gather and broadcast inside
    # the node, encoding, the mean), learned per region pair from cross-region exchanges
    # (``exchange_fit``): the runtime does the same work whichever link the exchange crosses, so
    # every exchange pays them.
    param_s = cm.exchange_param_seconds(regions, links.calibration)
    fixed_s = cm.exchange_fixed_seconds(regions, links.calibration)
    share = max(1.0, links.call_share)
    work = (fixed_s + n * param_s) * share
    groups, largest = len(regions), max(sum(c.values()) for c in by_region.values())
    local_s, wan_s = (0.0, 0.0)
    if groups >= 2 and largest >= 2:
        local_s, wan_s = (
            float(v) for v in cm.hierarchical_parts(sync, n, groups, gather_s, outer[0], outer[1])
        )
    if bool(cm.hierarchical_pays(sync, groups, largest, t, local_s + wan_s)):
        # Members to their region's head, the heads' ring over the WAN, the result back.
        per_head = float(cm.wan_bytes_per_leader(sync, n, groups))
        egress = _egress_usd(links, regions, per_head)
        basis = ExchangeBasis(
            local_s=local_s,
            bytes=per_head,
            bytes_per_s=outer[0],
            latency_s=4.0 * (groups - 1) * outer[2],
            rounds=2 * (groups - 1),
            call_s=outer[3],
            fixed_s=fixed_s,
            params=n,
            param_s=param_s,
            share=share,
            hierarchical=True,
        )
        return SyncCost(local_s + wan_s + work, egress, per_head * groups, basis)
    t += work
    factor = float(cm.wan_time_factor(sync, n, p_count))
    hops = float(cm.wan_latency_hops(sync, p_count))
    per_participant = float(cm.wan_bytes_per_leader(sync, n, p_count))
    egress, crossing = 0.0, 0.0
    if len(regions) >= 2:
        egress = _egress_usd(links, regions, per_participant)
        crossing = per_participant * len(regions)
    basis = ExchangeBasis(
        bytes=factor,
        bytes_per_s=bw_min,
        latency_s=hops * link_lat,
        rounds=cm.exchange_rounds(sync, p_count),
        call_s=call_max,
        fixed_s=fixed_s,
        params=n,
        param_s=param_s,
        share=share,
    )
    return SyncCost(t, egress, crossing, basis)


StageLeader = tuple[str, str, str]  # (region, cluster id, node id) of a group's leader of one stage


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
    sync = spec.sync
    share = max(1.0, links.call_share)
    load: dict[tuple[str, ...], float] = defaultdict(float)
    planned = []
    for stage, (ring, n_s) in enumerate(zip(rings, stage_params, strict=True)):
        p_count = len(ring)
        if p_count < 2:
            continue
        factor = float(cm.wan_time_factor(sync, n_s, p_count))
        by_region: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for region, cluster, node in ring:
            by_region[region][cluster].append(node)
        regions = sorted(by_region)
        pipes: list[tuple[tuple[str, ...], float]] = []
        lat_max = link_lat = call_max = 0.0
        for r in regions:
            call = links.call_s(r, r)
            for nodes_ in by_region[r].values():
                for node in nodes_:
                    bw, latency = ports[node]
                    pipes.append((("port", node, str(stage)), bw))
                    if len(nodes_) >= 2:  # a hop over the cluster's fabric
                        lat_max = max(lat_max, latency + call * links.call_share / 2.0)
                        link_lat, call_max = max(link_lat, latency), max(call_max, call)
            if len(by_region[r]) >= 2:
                pipes.append((("local", r), links.bw(r, r)))
                lat_max, link_lat = max(lat_max, links.lat(r, r)), max(link_lat, links.link_lat(r, r))
                call_max = max(call_max, call)
        for i, a in enumerate(regions):
            for b in regions[i + 1 :]:
                bw = min(links.bw(a, b), links.bw(b, a))
                if bw <= 0:
                    raise InvalidArgument(f"no link between regions {a!r} and {b!r}", regions=[a, b])
                pipes.append((("link", a, b), bw))
                lat_max = max(lat_max, links.lat(a, b), links.lat(b, a))
                link_lat = max(link_lat, links.link_lat(a, b), links.link_lat(b, a))
                call_max = max(call_max, links.call_s(a, b), links.call_s(b, a))
        if any(bw <= 0 for _, bw in pipes):
            raise InvalidArgument(f"no local link in region(s) {regions}", regions=regions)
        for key, _ in pipes:
            load[key] += factor
        planned.append((pipes, p_count, lat_max, link_lat, call_max, regions, n_s))
    if not planned:
        return SyncCost(0.0, 0.0, 0.0, ExchangeBasis())
    all_regions = sorted({r for *_, regions, _ in planned for r in regions})
    param_s = cm.exchange_param_seconds(all_regions, links.calibration)
    fixed_s = cm.exchange_fixed_seconds(all_regions, links.calibration)
    largest = max(n_s for *_, n_s in planned)
    t_max, basis_of = -1.0, None
    egress = crossing = 0.0
    for pipes, p_count, lat_max, link_lat, call_max, regions, n_s in planned:
        key, bw = max(pipes, key=lambda kb: load[kb[0]] / kb[1])
        hops = float(cm.wan_latency_hops(sync, p_count))
        t = load[key] / bw + hops * lat_max
        if t > t_max:
            t_max = t
            basis_of = ExchangeBasis(
                bytes=load[key],
                bytes_per_s=bw,
                latency_s=hops * link_lat,
                rounds=cm.exchange_rounds(sync, p_count),
                call_s=call_max,
                fixed_s=fixed_s,
                params=largest,
                param_s=param_s,
                share=share,
                rings=len(planned),
            )
        per_participant = float(cm.wan_bytes_per_leader(sync, n_s, p_count))
        if len(regions) >= 2:
            egress += _egress_usd(links, regions, per_participant)
            crossing += per_participant * len(regions)
    assert basis_of is not None
    t_sync = t_max + (fixed_s + largest * param_s) * share
    return SyncCost(t_sync, egress, crossing, basis_of)


def stage_rings(tasks: Sequence[PlannedTask], snapshot: ResourceSnapshot) -> list[list[StageLeader]]:
    """Per stage, every group's leader of it (``node_groups.stage_leader_nodes``), groups in order."""
    cluster_of = {t.node: t.cluster for t in tasks}
    clusters = snapshot.clusters_by_id()
    per_group = [stage_leader_nodes(tasks, set(g)) for g in node_groups(tasks)]
    return [
        [(clusters[cluster_of[n]].region, cluster_of[n], n) for n in (leaders[s] for leaders in per_group)]
        for s in range(len(per_group[0]))
    ]


@dataclass(frozen=True)
class Replica:
    """One dp rank: its devices in (stage, tp rank) order and the group it averages with every step."""

    rank: int
    devices: list[tuple[ClusterInfo, DeviceSlot]]
    participant: Participant  # (cluster, its torchrun group's first node, device model)
    nodes: tuple[str, ...] = ()  # every node it runs on, when more than the participant's
    # Per stage boundary (stage order), the (sending node, receiving node) of each tp rank's
    # transfer, when the replica spans nodes; () otherwise.
    boundaries: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def all_nodes(self) -> tuple[str, ...]:
        return self.nodes or (self.participant[1],)


def device_slots(snapshot: ResourceSnapshot) -> dict[tuple[str, str], dict[int, DeviceSlot]]:
    """(cluster id, node id) -> device index -> slot, kept with the snapshot."""

    def build(s: ResourceSnapshot) -> dict[tuple[str, str], dict[int, DeviceSlot]]:
        return {(c.id, n.id): {d.index: d for d in n.devices} for c in s.clusters for n in c.nodes}

    return snapshot.derived("device_slots", build)


def _replicas(
    snapshot: ResourceSnapshot, tasks: Sequence[PlannedTask], dp: int, tp: int, pp: int
) -> list[Replica]:
    clusters = snapshot.clusters_by_id()
    index = device_slots(snapshot)

    def slots_of(cid: str, node_id: str) -> dict[int, DeviceSlot]:
        if cid not in clusters:
            raise InvalidArgument(f"task names unknown cluster {cid!r}", cluster=cid)
        return index.get((cid, node_id), {})

    by_rank: dict[int, list[PlannedTask]] = defaultdict(list)
    for t in tasks:
        by_rank[t.dp_rank].append(t)
    if sorted(by_rank) != list(range(dp)):
        raise InvalidArgument(f"tasks must cover dp ranks 0..{dp - 1}", dp=dp)
    roles_needed = [(s, r) for s in range(pp) for r in range(tp)]
    out = []
    for rank in range(dp):
        group = by_rank[rank]
        if sorted((t.pp_stage, t.tp_rank) for t in group) != roles_needed:
            raise InvalidArgument(f"dp rank {rank} must have one task per (pp_stage, tp_rank)", dp_rank=rank)
        devices = []
        for t in group:
            found = slots_of(t.cluster, t.node).get(t.device)
            if found is None:
                raise InvalidArgument(
                    f"task names unknown device {t.cluster}/{t.node}/{t.device}", cluster=t.cluster
                )
            devices.append((clusters[t.cluster], found))
        models = {slot.model for _, slot in devices}
        if len(models) != 1:
            raise InvalidArgument(f"dp rank {rank} mixes device models {sorted(models)}", dp_rank=rank)
        nodes = tuple(dict.fromkeys(t.node for t in sorted(group, key=rank_key)))
        boundaries: tuple[tuple[tuple[str, str], ...], ...] = ()
        if len(nodes) > 1:
            at = {(t.pp_stage, t.tp_rank): t.node for t in group}
            boundaries = tuple(
                tuple(sorted({(at[(st, r)], at[(st + 1, r)]) for r in range(tp)})) for st in range(pp - 1)
            )
        out.append(
            Replica(
                rank,
                devices,
                (group[0].cluster, nodes[0], models.pop()),
                nodes if len(nodes) > 1 else (),
                boundaries,
            )
        )
    # Nodes that share a replica run as one torchrun group (node_groups): its replicas average
    # every step over the cluster's fabric, and its first node leads it.
    group_problems = node_group_problems(
        tasks,
        declared_nodes(snapshot),
        lambda a, b: private_between(snapshot, clusters[a].region, clusters[b].region),
    )
    if group_problems:
        raise InvalidArgument(group_problems[0], field="tasks")
    leader = {n: g[0] for g in node_groups(tasks) for n in g}
    return [
        replace(r, participant=(r.participant[0], leader[r.participant[1]], r.participant[2])) for r in out
    ]


@dataclass(frozen=True)
class LocalStep:
    """One replica's step before the cross-region exchange: the replica's compute and
    communication, the parts the node's reference step measured (0 where it measured none), and
    the seconds one checkpoint write takes there (amortised once the interval is known)."""

    replica: cm.ReplicaTime
    data: float
    optimizer: float
    write_s: float

    @property
    def work(self) -> float:
        """Seconds per step without checkpoint writes: what the runtime settings are chosen from."""
        return float(self.replica.total) + self.data + self.optimizer

    def total(self, writes_per_step: float) -> float:
        return self.work + self.write_s * writes_per_step


@dataclass(frozen=True)
class _Hosts:
    """Per host of a snapshot, what its CPU slots' share depends on (built once per snapshot)."""

    host_of: dict[str, str]  # node id -> host
    cores: dict[str, int]  # host -> physical cores (0: unknown)
    others: dict[str, float]  # host -> runnable threads there now besides a plan's, from contention
    busy: dict[str, int]  # host -> CPU slots busy with other jobs
    measured_under: dict[str, float]  # node id -> contention it measured its profile under


def others_now(contention: float, cores: int, busy_then: float | None, busy_now: int) -> float:
    """Runnable threads on a host now besides a new plan's, from one agent's contention figure c
    (runnable threads per core, its probe's own thread included): c·cores − 1 when it was
    measured. Where the CPU slots of other jobs busy at its probes are known, the figure counts
    them whatever runs now; they are taken out and the slots busy now put in, so a figure taken
    beside a job that has since ended (or before one that has since started) prices the host as
    it is. Not known: the figure stands for the host now."""
    measured = contention * cores - 1.0
    if busy_then is None:
        return max(0.0, measured)
    return max(0.0, measured - busy_then) + busy_now


def _hosts(snapshot: ResourceSnapshot) -> _Hosts:
    cores: dict[str, int] = {}
    busy: dict[str, int] = defaultdict(int)
    measured_under: dict[str, float] = {}
    host_of: dict[str, str] = {}
    figures: list[tuple[str, float, float | None]] = []  # (host, contention, busy at its probes)
    for c in snapshot.clusters:
        for n in c.nodes:
            host = n.host
            host_of[n.id] = host
            if n.profile and n.profile.physical_cores:
                cores[host] = max(cores.get(host, 0), n.profile.physical_cores)
                measured_under[n.id] = n.profile.host_load_factor
            if n.cpu_contention is not None:
                figures.append((host, n.cpu_contention, n.cpu_contention_busy))
            busy[host] += sum(d.kind == "cpu" and not d.free for d in n.devices)
    others: dict[str, float] = {}
    for host, contention, busy_then in figures:
        if n_cores := cores.get(host, 0):
            # On a host shared by several agents, the quietest figure saw the least of what
            # the control plane does not know of.
            o = others_now(contention, n_cores, busy_then, busy.get(host, 0))
            others[host] = min(others.get(host, math.inf), o)
    return _Hosts(host_of, cores, others, dict(busy), measured_under)


def host_shares(
    snapshot: ResourceSnapshot, tasks: Sequence[PlannedTask], one_per_node: bool = False
) -> dict[str, float]:
    """Per node of the plan: how many times slower than on an idle core its CPU slots run, start
    and stop. One-thread slots take turns on the host's physical cores with everything else that
    runs there. Where heartbeats report the host's contention c (runnable threads per core, a new
    one included: c·cores − 1 others, none on an idle host; less the other jobs' slots busy at its
    probes plus those busy now, where known: ``others_now``), the plan's k slots make it
    (others + k) / cores, at least 1;
    with none reported, other jobs' busy slots stand in for the others and the factor is at least
    the contention the host measured under at registration. Several agents may share one host
    (``NodeInfo.host``). 1 on CUDA nodes and where the cores are unknown. ``one_per_node``: the
    plan runs one process per node with CPU slots instead of one per slot (the launcher before
    the workers start)."""
    nodes = snapshot.nodes_by_id()
    kinds: dict[str, dict[int, str]] = {}
    cpu_slots: dict[str, int] = defaultdict(int)  # node id -> the plan's CPU slots there
    for t in tasks:
        node = nodes.get(t.node)
        if node is None:
            continue
        if t.node not in kinds:
            kinds[t.node] = {d.index: d.kind for d in node.devices}
        cpu_slots[t.node] += kinds[t.node].get(t.device) == "cpu"
    out = {t.node: 1.0 for t in tasks}
    if not any(cpu_slots.values()):
        return out
    if one_per_node:
        cpu_slots = defaultdict(int, {n: min(1, k) for n, k in cpu_slots.items()})
    hosts = snapshot.derived("hosts", _hosts)
    plan: dict[str, int] = defaultdict(int)
    for node_id, k in cpu_slots.items():
        plan[hosts.host_of.get(node_id, node_id)] += k
    for node_id in out:
        host = hosts.host_of.get(node_id, node_id)
        n_cores = hosts.cores.get(host, 0)
        if not plan[host] or not n_cores:
            continue
        if host in hosts.others:
            out[node_id] = cm.host_share(hosts.others[host] + plan[host], n_cores)
        else:
            share = cm.host_share(hosts.busy.get(host, 0) + plan[host], n_cores)
            out[node_id] = max(share, hosts.measured_under.get(node_id, 0.0), 1.0)
    return out


def _host_collective(
    node: NodeInfo, kind: str, ranks: int, tp: int, zero: int
) -> tuple[float, float, float] | None:
    """(call_s, gbps, wait_s) of the all-reduce a node of CPU slots measured between two of its
    host's ranks, where its ``ranks`` replicas all-reduce through DDP (ZeRO 0, no tp: FSDP's
    calls are others); None where the fabric's figures price them instead."""
    prof = node.profile
    if kind != "cpu" or ranks < 2 or tp != 1 or zero != 0 or prof is None:
        return None
    if prof.collective_call_s <= 0 or prof.collective_gbps <= 0:
        return None
    return prof.collective_call_s, prof.collective_gbps, prof.collective_wait_s


def _rate_key(rate: StepRateInfo | None) -> tuple[float, ...] | None:
    """What of a measured rate the local step is priced from, hashable."""
    if rate is None:
        return None
    return (
        rate.tflops,
        rate.micro_batch_s,
        rate.step_s,
        rate.optimizer_s_per_mparam,
        rate.data_s_per_mtoken,
        rate.checkpoint_s_per_mparam,
    )


def _replica_basis(
    rep: Replica,
    clusters: dict[str, ClusterInfo],
    nodes: dict[str, NodeInfo],
    shares: dict[str, float],
    precision: str,
    calibration: Calibration | None,
) -> tuple[float, float, StepRateInfo | None, float]:
    """What a replica's local step is priced from beside its stage links: its fabric (bytes/s,
    seconds), the measured rate it runs at (None: the defaults) and its host share."""
    devices = rep.devices
    cls = [clusters[i] for i in sorted({c.id for c, _ in devices})]
    intra_bw = min(intra_bytes_per_s(c, calibration) for c in cls)
    intra_lat = max(c.intra_latency_ms for c in cls) / 1000.0
    on = rep.all_nodes
    # A replica across nodes runs at its slowest node's pace (the busiest stage paces the
    # pipeline); a node without a measured rate leaves the whole replica to the defaults.
    rates = [p.rates.get(precision) if (p := nodes[n].profile) else None for n in on]
    rate = None if any(x is None for x in rates) else min(rates, key=lambda x: x.tflops)  # type: ignore[union-attr]
    share = max(shares.get(n, 1.0) for n in on) if devices[0][1].kind == "cpu" else 1.0
    return intra_bw, intra_lat, rate, share


@dataclass(frozen=True)
class Pace:
    """A replica's fabric and the rate its stages run at: effective FLOP/s and fixed seconds per
    micro-batch and per step (0 where no reference step measured them)."""

    intra_bw: float
    intra_lat: float
    flops: float
    micro_batch_s: float = 0.0
    step_s: float = 0.0


def _pace(
    rep: Replica,
    intra_bw: float,
    intra_lat: float,
    rate: StepRateInfo | None,
    share: float,
    precision: str,
    calibration: Calibration | None,
) -> Pace:
    slot = rep.devices[0][1]
    if rate is None:
        tflops = min([s.tflops for _, s in rep.devices])
        flops = cm.effective_flops(tflops, slot.model, slot.kind, precision, calibration)
        return Pace(intra_bw, intra_lat, flops / share)
    # The node's reference step: its FLOP rate (the calibrated efficiency scales it, 1 until runs
    # say otherwise) and fixed costs, slowed by the share of the host's cores.
    eff = cm.device_efficiency(slot.model, calibration, precision, default=1.0)
    return Pace(
        intra_bw,
        intra_lat,
        rate.tflops * 1e12 * eff / share,
        micro_batch_s=rate.micro_batch_s * share / eff,
        step_s=rate.step_s * share / eff,
    )


def _replica_time(
    spec: JobSpec,
    tp: int,
    pp: int,
    zero: int,
    n_micro: int,
    r: int,
    pace: Pace,
    pp_links: cm.PipelineLinks | None,
    schedule: str,
) -> cm.ReplicaTime:
    return cm.replica_time(
        spec,
        tp,
        pp,
        zero,
        n_micro,
        r,
        pace.flops,
        pace.intra_bw,
        pace.intra_lat,
        pace.intra_bw,
        pace.intra_lat,
        micro_batch_s=pace.micro_batch_s,
        step_s=pace.step_s,
        pp_links=pp_links,
        schedule=schedule,
    )


def _at_precision(spec: JobSpec, replicas: Sequence[Replica]) -> tuple[JobSpec, str]:
    """The spec at the precision its 'auto' resolves to on these replicas' devices."""
    precision = resolve_precision(spec.training.precision, {s.kind for r in replicas for _, s in r.devices})
    if precision != spec.training.precision:
        spec = spec.model_copy(update={"training": spec.training.model_copy(update={"precision": precision})})
    return spec, precision


def _group_sizes(replicas: Sequence[Replica]) -> dict[Participant, int]:
    """Replicas per torchrun group (its participant): they average gradients every step."""
    group_size: dict[Participant, int] = defaultdict(int)
    for rep in replicas:
        group_size[rep.participant] += 1
    return group_size


def _shares(
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    replicas: Sequence[Replica],
    one_per_node: bool = False,
) -> dict[str, float]:
    """``host_shares``, without a pass over the tasks where no CPU slot is planned (all 1)."""
    if any(s.kind == "cpu" for rep in replicas for _, s in rep.devices):
        return host_shares(snapshot, tasks, one_per_node)
    return dict.fromkeys((n for rep in replicas for n in rep.all_nodes), 1.0)


@dataclass(frozen=True)
class ReplicaWalk:
    """One replica's local step as the estimate prices it, its stage links left open: what a
    search over the replica's stage order (``stage_order``) prices each candidate order with."""

    rank: int
    spec: JobSpec
    tp: int
    pp: int
    zero: int
    n_micro: int
    group_size: int
    pace: Pace
    schedule: str

    def pp_comm(self, links: cm.PipelineLinks) -> float:
        """Seconds the stage transfers add to the step over these links (the walked schedule)."""
        rt = _replica_time(
            self.spec,
            self.tp,
            self.pp,
            self.zero,
            self.n_micro,
            self.group_size,
            self.pace,
            links,
            self.schedule,
        )
        return float(rt.pp_comm)


def replica_walks(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    *,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    pp_schedule: str = "1f1b",
    calibration: Calibration | None = None,
) -> list[ReplicaWalk]:
    """Per dp rank of these tasks, what ``estimate_planned`` prices its local step from, as it
    does (the same rate, host share, fabric and schedule), its stage links to be given."""
    replicas = _replicas(snapshot, tasks, dp, tp, pp)
    spec, precision = _at_precision(spec, replicas)
    n_micro = n_micro_batches(spec, dp)
    group_size = _group_sizes(replicas)
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    shares = _shares(snapshot, tasks, replicas)
    out = []
    for rep in replicas:
        intra_bw, intra_lat, rate, share = _replica_basis(
            rep, clusters, nodes, shares, precision, calibration
        )
        pace = _pace(rep, intra_bw, intra_lat, rate, share, precision, calibration)
        out.append(
            ReplicaWalk(rep.rank, spec, tp, pp, zero, n_micro, group_size[rep.participant], pace, pp_schedule)
        )
    return out


def _fixed_seconds(
    node: NodeInfo, share: float, launch_share: float, calibration: Calibration | None
) -> tuple[float, float]:
    """A node's start-up and teardown for this plan: per idle core (calibrated, else as measured at
    registration: the start-up already per idle core, the teardown's wall time divided by the load
    it measured under), times this plan's share of the host: the launcher's part of the start-up
    at ``launch_share`` (one process per node then), the workers' part and the teardown at ``share``."""
    prof = node.profile
    under = max(1.0, prof.host_load_factor) if prof else 1.0
    launcher, workers = cm.startup_parts(
        node.id, prof.startup_s if prof else None, prof.launcher_s if prof else 0.0, calibration
    )
    teardown = cm.teardown_seconds(node.id, prof.teardown_s / under if prof else None, calibration)
    return launcher * launch_share + workers * share, teardown * share


def estimate_option(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    *,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    pp_schedule: str = "1f1b",
    spot: bool = False,
    calibration: Calibration | None = None,
    runtime: RuntimeSettings | None = None,
) -> Estimates:
    """Time, cost and memory of running spec on exactly these tasks, with the given runtime
    settings (checkpoint interval, overlap); without them, as the spec alone says.

    The spec's precision 'auto' resolves on these devices (``contracts.feasibility``).
    Raises InvalidArgument when the tasks are not a complete dp×pp×tp grid, a replica mixes
    device models or spans nodes, a device runs out of memory, or two participating regions have
    no link.
    """
    kw = dict(dp=dp, tp=tp, pp=pp, zero=zero, pp_schedule=pp_schedule, spot=spot, calibration=calibration)
    # "auto" sync settings: the runtime's, where it states them, else the planner's provisional ones.
    spec = spec.model_copy(
        update={
            "sync": spec.sync.with_choices(
                runtime.sync_every if runtime else None, runtime.sync_compression if runtime else None
            )
        }
    )
    spec = provisional(spec)[0]
    return _estimate(spec, snapshot, tasks, runtime=runtime, derive=False, **kw)[0]


def estimate_planned(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    *,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    pp_schedule: str = "1f1b",
    spot: bool = False,
    calibration: Calibration | None = None,
    replicas: list[Replica] | None = None,
    auto: AutoSync | None = None,
) -> tuple[Estimates, RuntimeSettings]:
    """The runtime settings these tasks get (``runtime_settings.settings_for``, from their own
    local step, nodes and links) and the estimates priced with them, in one pass. ``replicas``,
    when the caller built the tasks from them, saves re-deriving (and re-checking) them. A spec
    that leaves sync settings to the planner ("auto") gets them chosen here for these tasks
    (``sync_choice``); ``auto`` says which, for a spec the caller already resolved provisionally."""
    if auto is None:
        spec, auto = provisional(spec)
    kw = dict(dp=dp, tp=tp, pp=pp, zero=zero, pp_schedule=pp_schedule, spot=spot, calibration=calibration)
    est, runtime = _estimate(
        spec, snapshot, tasks, runtime=None, derive=True, replicas=replicas, auto=auto, **kw
    )
    assert runtime is not None
    return est, runtime


def _estimate(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    *,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    pp_schedule: str,
    spot: bool,
    calibration: Calibration | None,
    runtime: RuntimeSettings | None,
    derive: bool,
    replicas: list[Replica] | None = None,
    auto: AutoSync | None = None,
) -> tuple[Estimates, RuntimeSettings | None]:
    batch = spec.global_batch_sequences
    if dp < 1 or batch % dp or (batch // dp) % spec.training.micro_batch_size:
        raise InvalidArgument(
            f"dp={dp} does not split {batch} sequences into micro-batches of "
            f"{spec.training.micro_batch_size}",
            field="dp",
        )
    clusters = snapshot.clusters_by_id()
    if replicas is None:
        replicas = _replicas(snapshot, tasks, dp, tp, pp)
    spec, precision = _at_precision(spec, replicas)
    n_micro = n_micro_batches(spec, dp)
    group_size = _group_sizes(replicas)

    nodes = snapshot.nodes_by_id()
    in_order = dict.fromkeys(n for rep in replicas for n in rep.all_nodes)
    plan_nodes = sorted(in_order)
    shares = _shares(snapshot, tasks, replicas)
    launch_shares = _shares(snapshot, tasks, replicas, one_per_node=True)
    # An exchange's calls run on the leaders: the slowest leader's host share slows them.
    links = Links(snapshot, calibration, max(shares.get(p_[1], 1.0) for p_ in group_size))
    steps = spec.training.steps
    # No reference step measured: checkpoint writes at the runtime's own estimate.
    default_write_s = (
        runtime_terms(spec).write_s if derive else runtime.checkpoint_write_s if runtime is not None else 0.0
    )

    # Replicas across nodes only (``spanning``): a node's cluster and who shares its pipes.
    spanning = [rep.boundaries for rep in replicas if rep.boundaries]
    cluster_of = node_clusters(snapshot) if spanning else {}
    cluster_pipes = pipe_shares(spanning, cluster_of)
    locals_: list[LocalStep] = []
    peak_bytes = 0.0
    seen: set[tuple] = set()
    for rep in replicas:
        devices = rep.devices
        model = devices[0][1].model
        tflops = min([s.tflops for _, s in devices])
        kind = devices[0][1].kind
        smallest = min([s.memory_gb for _, s in devices])
        r = group_size[rep.participant]
        on = rep.all_nodes
        intra_bw, intra_lat, rate, share = _replica_basis(
            rep, clusters, nodes, shares, precision, calibration
        )
        pp_links = (
            pipeline_links(
                rep.boundaries,
                cluster_of,
                nodes,
                snapshot,
                intra_bw,
                intra_lat,
                cluster_pipes,
                tp,
                calibration,
            )
            if rep.boundaries
            else None
        )
        host_collective = _host_collective(nodes[on[0]], kind, r, tp, zero) if len(on) == 1 else None
        # A checkpoint write's fixed part at the host share, its bytes at the measured rate.
        write_fixed = max(cm.checkpoint_fixed_seconds(n, calibration) for n in on) * share
        # Only the slowest local step counts, and a replica's is a function of what it is priced
        # from: its fabric, the measured rate it runs at, its host share, its weakest device, its
        # group size and its stage links. Replicas alike in all of these are priced once, whatever
        # nodes or clusters hold them (node ids would price every profiled replica apart).
        key = (
            intra_bw,
            intra_lat,
            _rate_key(rate),
            share,
            model,
            kind,
            tflops,
            smallest,
            r,
            pp_links,
            write_fixed,
            host_collective,
        )
        if key in seen:
            continue
        seen.add(key)
        pace = _pace(rep, intra_bw, intra_lat, rate, share, precision, calibration)
        rt = _replica_time(spec, tp, pp, zero, n_micro, r, pace, pp_links, pp_schedule)
        if rate is None:
            locals_.append(LocalStep(rt, 0.0, 0.0, default_write_s))
        else:
            if host_collective is not None:
                # The node's ranks all-reduce among themselves on the host's cores, not over a
                # fabric: priced from the all-reduce the node measured (``cm.host_dp_comm_s``).
                grad_bytes = cm.stage_params(spec.model, tp, pp) * cm.GRAD_BYTES
                rt = replace(rt, dp_comm=cm.host_dp_comm_s(grad_bytes, r, share, *host_collective))
            p = cm.stage_params(spec.model, tp, pp) / 1e6
            opt_params = p / r if zero >= 1 else p
            local_tokens = n_micro * spec.training.micro_batch_size * spec.model.seq_len
            locals_.append(
                LocalStep(
                    rt,
                    data=rate.data_s_per_mtoken * local_tokens / 1e6 * share,
                    optimizer=rate.optimizer_s_per_mparam * opt_params * share,
                    write_s=rate.checkpoint_s_per_mparam * p + write_fixed,
                )
            )
        mem = cm.memory_per_device(spec, tp, pp, zero, r, n_micro, pp_schedule).total
        if not cm.fits(mem, smallest):
            raise InvalidArgument(
                f"dp rank {rep.rank} needs {mem / cm.GB:.2f} GB per device; smallest device has "
                f"{smallest:g} GB ({cm.USABLE_MEMORY_FRACTION:.0%} usable)",
                dp_rank=rep.rank,
            )
        peak_bytes = max(peak_bytes, mem)

    members: dict[str, int] = defaultdict(int)
    for p_ in group_size:
        members[clusters[p_[0]].region] += 1
    # A ring between a cluster's participants runs at its slowest leader's port.
    fabric: dict[str, tuple[float, float]] = {}
    for p_ in group_size:
        c = clusters[p_[0]]
        gbps, lat_ms = c.port(nodes[p_[1]])
        bw_was, lat_was = fabric.get(c.id, (math.inf, 0.0))
        fabric[c.id] = (min(bw_was, port_bytes_per_s(c, gbps, calibration)), max(lat_was, lat_ms / 1000.0))
    if per_stage_sync(tasks, spec.sync.mode, pp):
        # Each stage's leaders ring on their own (``training.sync.stages``); the calls run on
        # every stage leader's host, so the slowest of those hosts slows them.
        rings = stage_rings(tasks, snapshot)
        leaders = {n for ring in rings for _, _, n in ring}
        stage_links = Links(snapshot, calibration, max(shares.get(n, 1.0) for n in leaders))
        ports = {
            n: (port_bytes_per_s(clusters[c], gbps, calibration), lat_ms / 1000.0)
            for ring in rings
            for _, c, n in ring
            for gbps, lat_ms in [clusters[c].port(nodes[n])]
        }
        sc = stage_sync_cost(spec, stage_links, rings, ports, cm.stage_param_counts(spec.model, pp))
    else:
        sc = sync_cost(spec, links, [(clusters[p_[0]].region, p_[0]) for p_ in group_size], fabric)
    xb = sc.basis
    # Beside the steps, on a host with no idle core, the exchange's CPU work takes turns with
    # the leader's training thread (``overlapped_exchange_s``).
    t_beside = float(
        overlapped_exchange_s(sc.t_sync, (xb.fixed_s + xb.params * xb.param_s) * xb.share, xb.share)
    )
    if derive:
        work = max(loc.work for loc in locals_)
        bandwidth, latency = weakest_link(set(members), snapshot)
        # The delay from the exchange as priced here (calibrated goodput and per-call seconds, and
        # its CPU beside the steps): the search's objective ranks by the blocking figure
        # (``problem.runtime_step``).
        t_exchange = t_beside if math.isfinite(t_beside) else None
        choice = None
        if auto is not None and auto.any:
            # H from the exchange as the steps see it: beside them where DiLoCo overlaps it.
            beside = spec.sync.mode == "diloco" and len(plan_nodes) >= 2
            hourly_usd = hourly_price(replicas, spot)
            choice = choice_for(
                spec,
                auto,
                work,
                t_beside if beside else sc.t_sync,
                len(plan_nodes),
                egress_usd=sc.egress_usd,
                device_usd_per_s=hourly_usd / 3600.0,
            )
            if choice.every is not None:
                spec = with_every(spec, choice.every)
        runtime = settings_for(spec, work, len(plan_nodes), bandwidth, latency, t_exchange)
        if choice is not None:
            runtime = runtime.model_copy(
                update={
                    "sync_every": choice.every,
                    "sync_compression": choice.compression,
                    "sync_choice": choice.reason,
                }
            )
    every = runtime.checkpoint_every if runtime is not None else spec.training.checkpoint_every
    wps = cm.checkpoint_writes(steps, every) / steps
    slowest = max(locals_, key=lambda loc: loc.total(wps))
    t_local = slowest.total(wps)
    terms = runtime_terms(spec)
    overlapped = runtime is not None and runtime.overlap and terms.diloco
    # Regions that exchange every H steps drift apart over those steps; at a blocking exchange the
    # first to arrive waits for the last (calibrated per region pair, 0 until runs show it). An
    # overlapped round hides its exchange, not that lag: the run waits for the last region all
    # the same (``runtime_pricing.drift_per_step``).
    # The lag has a part that grows with the round's steps and a fixed part per round at the
    # leaders' host share (``drift_fit``), learned apart for rounds that overlap the steps.
    h_sync = cm.sync_every(spec.sync)
    drift = drift_fixed = 0.0
    if h_sync > 1 and len(members) >= 2:
        drift = cm.exchange_drift(sorted(members), calibration, overlapped)
        drift_fixed = cm.exchange_drift_fixed_s(sorted(members), calibration, overlapped)
    drift_s = drift * h_sync * t_local + drift_fixed * max(1.0, sc.basis.share)
    t_sync = sc.t_sync + (0.0 if overlapped else drift_s)
    # What the exchange hides behind is the steps' work: a checkpoint write comes once in many
    # rounds, so its amortised share would hide a round's exchange that no step covers.
    wan = float(
        wan_per_step(
            terms,
            t_beside if overlapped else t_sync,
            slowest.work,
            overlapped,
            runtime.overlap_steps or 0 if runtime is not None else 0,
            runtime.fragments if runtime is not None else 1,
        )
    )
    if overlapped:
        wan += float(drift_per_step(terms, drift_s))
    rt = slowest.replica
    step = StepBreakdown(
        data=slowest.data,
        compute=float(rt.compute),
        optimizer=slowest.optimizer,
        tp_comm=float(rt.tp_comm),
        dp_comm=float(rt.dp_comm),
        pp_bubble=float(rt.pp_bubble),
        pp_comm=float(rt.pp_comm),
        wan_sync=wan,
        checkpoint=slowest.write_s * wps,
    )
    fixed = [
        _fixed_seconds(nodes[n], shares.get(n, 1.0), launch_shares.get(n, 1.0), calibration)
        for n in plan_nodes
    ]
    startup = max(f[0] for f in fixed)
    teardown = max(f[1] for f in fixed)
    final_sync = float(final_sync_s(terms, t_sync, overlapped, len(group_size)))
    duration = startup + steps * step.total + final_sync + teardown
    hourly = hourly_price(replicas, spot)
    per_step_exchanges = cm.exchanges_per_step(spec.sync, steps)
    # Pipelines across regions: every step each micro-batch's activation crosses forward and its
    # gradient back, one message per tp rank, each egress from its sender's region.
    message = spec.training.micro_batch_size * spec.model.seq_len * spec.model.d_model * cm.RESIDUAL_BYTES
    pipe_bytes, pipe_usd = 0.0, 0.0
    for (a, b), count in (wan_messages(tasks, clusters) if spanning else {}).items():
        sent = count * n_micro * message
        pipe_bytes += sent
        pipe_usd += sent / cm.GB * links.egress(a, b)
    cost = CostBreakdown(
        devices=hourly * duration / 3600.0,
        egress=(sc.egress_usd * per_step_exchanges + pipe_usd) * steps,
    )
    est = Estimates(
        step_s=step,
        steps=steps,
        startup_s=startup,
        final_sync_s=final_sync,
        teardown_s=teardown,
        duration_s=duration,
        cost=cost,
        memory_per_device_gb=peak_bytes / cm.GB,
        tokens_per_s=spec.training.global_batch_tokens / step.total if step.total > 0 else 0.0,
        wan_bytes_per_step=sc.wan_bytes * per_step_exchanges + pipe_bytes,
        interval=interval(duration, cost.total, calibration),
        basis=basis(tasks, snapshot, precision, calibration, shares, launch_shares).model_copy(
            update={
                "exchange": sc.basis.model_copy(
                    update={
                        "blocking": not overlapped,
                        "every": h_sync,
                        "drift": drift,
                        "drift_fixed_s": drift_fixed,
                    }
                )
            }
        ),
    )
    return est, runtime
