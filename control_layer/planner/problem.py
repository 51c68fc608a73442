"""The placement problem of one candidate, as arrays over placement units.

A member is one node's free devices of one model (a ``Pool``): the search keeps a replica whole
on a node (the runtime could run it across nodes of a cluster, ``node_groups``, and
``estimate_option`` prices such a placement, but the search does not propose one yet), ZeRO
shards and gradients are all-reduced every step among the replicas of that node, and nodes meet
through the job's sync. A unit is a
class of identical members (same region, device model and kind, price, speed, memory, fabric and
free devices: any member is as good as another); a member hosts free // (tp·pp) replicas. A
solution says, per unit, how many members host exactly one replica (n1) and how many host two
or more (n2, holding x2 replicas in all): the in-node gradient all-reduce and ZeRO sharding
differ between the two.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import numpy as np

from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.candidates import Degrees
from control_layer.planner.fleet import Pool
from control_layer.planner.links import Links, intra_bytes_per_s, port_bytes_per_s
from control_layer.planner.listing import natural
from control_layer.planner.local_step import n_micro_batches
from control_layer.planner.plan_types import Calibration
from control_layer.planner.runtime_pricing import (
    RuntimeTerms,
    checkpoint_s_per_step,
    delay_steps,
    final_sync_s,
    overlaps,
    runtime_terms,
    wan_per_step,
)
from control_layer.planner.snapshot import ResourceSnapshot

T = TypeVar("T")

INFEASIBLE = 1 << 30


@dataclass(frozen=True)
class PoolClass:
    pools: tuple[Pool, ...]  # members (nodes): the cluster holding most of them first, then by
    # cluster id and node id (``assign`` fills them in this order)

    @property
    def first(self) -> Pool:
        return self.pools[0]


@dataclass
class Fleet:
    """Plan-wide constants: pool classes, regions and the sync cost between them."""

    spec: JobSpec
    snapshot: ResourceSnapshot
    calibration: Calibration | None
    pools: list[Pool]
    classes: list[PoolClass]
    regions: list[str]
    cls_region: np.ndarray  # class -> region index
    cls_flops: np.ndarray  # effective FLOP/s
    cls_intra_bw: np.ndarray  # inside a node: the cluster's fabric (tp, pp, the node's gradient ring)
    cls_intra_lat: np.ndarray
    # Between two nodes: the slower of their ports (``ClusterInfo.port``; the cluster's fabric
    # where a node declared none), bytes/s, so a class's nodes share one port figure.
    cls_port_bw: np.ndarray
    cls_memory: np.ndarray  # GB
    cls_price: np.ndarray
    cls_node_free: np.ndarray  # class × node: free devices per node (zero-padded)
    cls_group: np.ndarray  # classes with equal speed, fabric and price share a group
    cls_count: np.ndarray  # members (nodes) per class
    local_sync: np.ndarray  # per region: two payloads over its local link (heuristic and MILP)
    local_bw: np.ndarray  # per region: bytes/s between two of its clusters (local link)
    local_lat: np.ndarray  # per region: one hop's seconds on the local link (with half a call)
    cls_hop_lat: np.ndarray  # per class: one hop's seconds through its nodes' port (with half a call)
    cls_first_cluster: np.ndarray  # per class: members in its first cluster (filled first)
    cls_first_cid: np.ndarray  # per class: an index of its first cluster (equal: the same cluster)
    # Per region, the fastest hop between two of its nodes (its local link or a cluster fabric
    # there, bytes/s) and the lowest latency of such a hop: what any exchange there is bounded by.
    hop_bw: np.ndarray
    hop_lat: np.ndarray
    # Per region, the most members (pools) one of its clusters holds: more members than that in
    # the region span two clusters or more, so their exchange crosses its local link.
    cluster_members: np.ndarray
    pair_bw: np.ndarray  # R×R bytes/s (min of both directions; 0 = no link)
    pair_lat: np.ndarray  # R×R seconds (max of both directions)
    egress: np.ndarray  # R×R USD/GB from row region to column region
    max_node_devices: int
    n_devices: int  # free devices in the pools
    # sync constants indexed by the number of participating regions R = 0..n_regions
    wan_factor: np.ndarray
    wan_hops: np.ndarray
    per_leader: np.ndarray
    xps: float  # exchanges per step
    overlapped: bool
    links: Links
    runtime: RuntimeTerms
    # Start-up and teardown of the slowest candidate node: a run's fixed seconds as the search
    # ranks placements (the estimator prices the chosen nodes exactly).
    fixed_s: float = 0.0
    # The fixed cost and the leaders' per-parameter work of one cross-region exchange at σ = 1, at
    # the largest figures among the fleet's region pairs (the estimator prices the chosen pairs).
    wan_param_s: float = 0.0
    layouts: dict[tuple[int, int], Layout] = field(default_factory=dict)
    # The heuristic's region sets per (eligible capacity per unit, dp): candidates that admit the
    # same units at a level grow the same sets (heuristic._region_sets); shared by the quotes on
    # one snapshot with the same pools and calibration.
    region_sets: dict[tuple[bytes, int], list[np.ndarray]] = field(default_factory=dict)
    # The order in which a compact region set grows from an anchor region, per (anchor, which
    # regions have room) (``heuristic._growth_order``): it follows from the links alone, so it is
    # shared like region_sets.
    growth_orders: dict[tuple[int, bytes], list[int]] = field(default_factory=dict)
    # Per set of regions in use (ascending indices, two or more): the slowest link, the highest
    # latency and the sum over the regions of their dearest egress to the others
    # (``sync_seconds_and_egress``); they follow from the region pairs alone, so they are shared
    # like region_sets.
    region_links: dict[tuple[int, ...], tuple[float, float, float]] = field(default_factory=dict)
    # The same per set of regions as the heuristic's fill scoring reads it (``heuristic._set_links``,
    # keyed by a bitmask of region indices): the slowest link, the highest latency and each
    # region's dearest egress to another of the set.
    fill_links: dict[int, tuple[float, float, np.ndarray]] = field(default_factory=dict)
    # The WAN floor's per-row orderings of the region links (``bounds._wan_floor``), built once.
    wan_orders: dict[str, object] = field(default_factory=dict)
    # This job's exchange seconds per (participants, slowest hop, highest latency) and bytes per
    # participant per participant count (``sync_seconds_and_egress``): solutions scored in one
    # quote meet the same few; they depend on the job, so they live with this fleet only.
    exchange_memo: dict[tuple, float] = field(default_factory=dict)


def _member_order(members: list[Pool]):
    """A class's members, the cluster with most of them first: its nodes meet over their
    cluster's fabric, so the fills keep as many as they can there."""
    per_cluster: dict[str, int] = defaultdict(int)
    for p in members:
        per_cluster[p.cluster.id] += 1
    return lambda p: (-per_cluster[p.cluster.id], p.cluster.id, p.nodes[0][0])


def _groups_of(keys: list[tuple]) -> np.ndarray:
    ids: dict[tuple, int] = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def _node_matrix(shapes: list[tuple[int, ...]]) -> np.ndarray:
    out = np.zeros((len(shapes), max((len(s) for s in shapes), default=0)), dtype=np.int64)
    for i, s in enumerate(shapes):
        out[i, : len(s)] = s
    return out


@dataclass(frozen=True)
class _Classes:
    """What grouping a pool list into classes yields, independent of the job and calibration."""

    pools: tuple[Pool, ...]
    classes: list[PoolClass]
    cls_memory: np.ndarray
    cls_price: np.ndarray
    cls_node_free: np.ndarray
    cls_count: np.ndarray
    cls_group: np.ndarray
    cls_intra_lat: np.ndarray
    cls_port: list[tuple[float, float]]  # its nodes' port: Gb/s, one-way ms
    cls_first_cluster: np.ndarray  # members in the class's first cluster
    cluster_pools: dict[str, tuple[str, int]]  # cluster id -> (its region, its pools in the list)
    max_node_devices: int
    n_devices: int


# Pool lists whose classes are kept per snapshot (QoS filters make a few distinct lists).
CLASS_CACHE_SIZE = 32
# Classes (a class key and its members) kept per snapshot across pool lists (cleared when full).
CLASS_ENTRIES_KEPT = 65536


@dataclass(frozen=True)
class _ClassEntry:
    """One class as a pool list yields it: its members in ``_member_order``, its place among the
    classes (``order``) and how many members its first cluster holds."""

    cls: PoolClass
    order: tuple
    in_first_cluster: int
    per_cluster: tuple[tuple[str, int], ...]  # (cluster id, members there) per cluster it spans


def _class_entry(g: list[Pool]) -> _ClassEntry:
    # Classes by their lowest cluster id and its lowest node id (numbers in ids compared as
    # numbers): never by the order the fleet happens to list its nodes in.
    order = (g[0].region, g[0].model, min((p.cluster.id, natural(p.nodes[0][0])) for p in g))
    cls = PoolClass(tuple(sorted(g, key=_member_order(g))))
    per_cluster = Counter(p.cluster.id for p in g)
    return _ClassEntry(cls, order, per_cluster[cls.first.cluster.id], tuple(per_cluster.items()))


def _class_entries(snapshot: ResourceSnapshot, pools: list[Pool]) -> list[_ClassEntry]:
    """The pools' classes in order. QoS filters mostly keep or drop whole classes (a class lies in
    one region, one device model and price), so each class is kept with the snapshot under its
    members' identities and shared by the pool lists that hold all of it (the entry holds the
    pools, so no other pool can take their ids)."""
    kept: dict[tuple, _ClassEntry] = snapshot.derived("pool_class_entries", lambda _: {})
    groups: dict[tuple, list[Pool]] = defaultdict(list)
    for p in pools:
        groups[p.class_key].append(p)
    entries = []
    for g in groups.values():
        key = tuple(map(id, g))
        got = kept.get(key)
        if got is None:
            if len(kept) >= CLASS_ENTRIES_KEPT:
                kept.clear()
            got = kept[key] = _class_entry(g)
        entries.append(got)
    entries.sort(key=lambda e: e.order)
    return entries


def _classes(snapshot: ResourceSnapshot, pools: list[Pool]) -> _Classes:
    """Pool classes, kept with the snapshot per pool list: the snapshot keeps its pools across
    quotes, so the same filter yields the same Pool objects (keyed by their identities; the entry
    holds the pools, so no other pool can take their ids)."""
    cache: dict[tuple[int, ...], _Classes] = snapshot.derived("pool_classes", lambda _: {})
    key = tuple(map(id, pools))
    got = cache.get(key)
    if got is not None:
        return got
    entries = _class_entries(snapshot, pools)
    classes = [e.cls for e in entries]
    firsts = [c.first for c in classes]
    got = _Classes(
        pools=tuple(pools),
        classes=classes,
        cls_memory=np.array([p.memory_gb for p in firsts], dtype=float),
        cls_price=np.array([p.price for p in firsts], dtype=float),
        cls_node_free=_node_matrix([p.free_per_node for p in firsts]),
        cls_count=np.array([len(c.pools) for c in classes], dtype=np.int64),
        cls_group=_groups_of(
            [
                (
                    p.region,
                    p.tflops,
                    p.model,
                    p.kind,
                    p.price,
                    p.cluster.intra_bandwidth_gbps,
                    p.cluster.intra_latency_ms,
                    p.port_figures,
                )
                for p in firsts
            ]
        ),
        cls_intra_lat=np.array([p.cluster.intra_latency_ms / 1000.0 for p in firsts], dtype=float),
        cls_port=[p.port_figures for p in firsts],
        cls_first_cluster=np.array([e.in_first_cluster for e in entries], dtype=np.int64),
        cluster_pools=_cluster_pools(entries),
        max_node_devices=max((max(p.free_per_node) for p in pools), default=0),
        n_devices=sum(p.n_free for p in pools),
    )
    if len(cache) >= CLASS_CACHE_SIZE:
        cache.pop(next(iter(list(cache))), None)  # list(): atomic under concurrent quotes
    cache[key] = got
    return got


def prepare_classes(snapshot: ResourceSnapshot, pools: list[Pool]) -> None:
    """Group the snapshot's whole pool list into classes ahead of its first quote: a QoS filter
    that keeps or drops whole classes then finds each of its classes kept."""
    _classes(snapshot, pools)


def _port_hops(
    grouped: _Classes, calibration: Calibration | None, links: Links
) -> tuple[np.ndarray, np.ndarray]:
    """Per class, a hop between two nodes through their ports: bytes/s, and one-way seconds with
    half an exchange call's fixed cost (as ``Links.lat``)."""
    firsts = [c.first for c in grouped.classes]
    port_bw = [
        port_bytes_per_s(p.cluster, gbps, calibration)
        for p, (gbps, _) in zip(firsts, grouped.cls_port, strict=True)
    ]
    hop_lat = [
        lat_ms / 1000.0 + links.call_s(p.region, p.region) / 2.0
        for p, (_, lat_ms) in zip(firsts, grouped.cls_port, strict=True)
    ]
    return np.array(port_bw, dtype=float), np.array(hop_lat, dtype=float)


def build_fleet(
    spec: JobSpec, snapshot: ResourceSnapshot, pools: list[Pool], calibration: Calibration | None
) -> Fleet:
    grouped = _classes(snapshot, pools)
    classes = grouped.classes
    regions = sorted({p.region for p in pools})
    ridx = {r: i for i, r in enumerate(regions)}
    n = float(spec.model.n_params)
    nr = len(regions)
    cal_key = "" if calibration is None else calibration.model_dump_json()
    pairs = _pairs(snapshot, calibration, cal_key, tuple(regions))
    links = pairs.links
    local = np.array([cm.local_sync_s(spec.sync, n, links.bw(a, a), links.lat(a, a)) for a in regions])
    local_bw = np.array([links.bw(a, a) for a in regions], dtype=float)
    local_lat = np.array([links.lat(a, a) for a in regions], dtype=float)
    firsts = [c.first for c in classes]
    cls_intra_bw = np.array([intra_bytes_per_s(p.cluster, calibration) for p in firsts], dtype=float)
    cls_port_bw, cls_hop_lat = _port_hops(grouped, calibration, links)
    cls_region = np.array([ridx[p.region] for p in firsts], dtype=int)
    cls_first_cluster = grouped.cls_first_cluster
    # Two nodes of a region meet over its fastest hop at best: the local link or a fabric there.
    best_bw, best_lat = local_bw.copy(), local_lat.copy()
    for u in range(len(classes)):
        r = cls_region[u]
        best_bw[r] = max(best_bw[r], cls_port_bw[u])
        best_lat[r] = min(best_lat[r], cls_hop_lat[u])
    # Keyed by the pools' identities; the entry holds the pools, so no other list can take their ids.
    pool_ids = tuple(map(id, pools))
    _, fixed_s = _kept(
        snapshot,
        "fixed_s",
        (pool_ids, cal_key),
        lambda: (grouped.pools, _fixed_seconds(snapshot, classes, calibration, cal_key)),
    )
    # The heuristic's region sets follow from the pools, their links (calibrated) and a
    # candidate's capacity per unit and dp: later quotes on the same snapshot reuse them.
    _, region_sets = _kept(snapshot, "region_sets", (pool_ids, cal_key), lambda: (grouped.pools, {}))
    _, region_links = _kept(snapshot, "region_links", (pool_ids, cal_key), lambda: (grouped.pools, {}))
    _, fill_links = _kept(snapshot, "fill_links", (pool_ids, cal_key), lambda: (grouped.pools, {}))
    _, wan_orders = _kept(snapshot, "wan_orders", (pool_ids, cal_key), lambda: (grouped.pools, {}))
    _, growth_orders = _kept(snapshot, "growth_orders", (pool_ids, cal_key), lambda: (grouped.pools, {}))
    _, cluster_members = _kept(
        snapshot, "cluster_members", pool_ids, lambda: (grouped.pools, _cluster_members(grouped, ridx))
    )
    return Fleet(
        spec=spec,
        snapshot=snapshot,
        calibration=calibration,
        pools=pools,
        classes=classes,
        regions=regions,
        cls_region=cls_region,
        cls_flops=np.array(
            [
                cm.effective_flops(p.tflops, p.model, p.kind, spec.training.precision, calibration)
                for p in firsts
            ],
            dtype=float,
        ),
        cls_intra_bw=cls_intra_bw,
        cls_intra_lat=grouped.cls_intra_lat,
        cls_port_bw=cls_port_bw,
        cls_memory=grouped.cls_memory,
        cls_price=grouped.cls_price,
        cls_node_free=grouped.cls_node_free,
        cls_count=grouped.cls_count,
        cls_group=grouped.cls_group,
        local_sync=local,
        local_bw=local_bw,
        local_lat=local_lat,
        cls_hop_lat=cls_hop_lat,
        cls_first_cluster=cls_first_cluster,
        cls_first_cid=_groups_of([(c.first.cluster.id,) for c in classes]),
        hop_bw=best_bw,
        hop_lat=best_lat,
        cluster_members=cluster_members,
        pair_bw=pairs.bw,
        pair_lat=pairs.lat,
        egress=pairs.egress,
        max_node_devices=grouped.max_node_devices,
        n_devices=grouped.n_devices,
        wan_factor=cm.wan_time_factor(spec.sync, n, np.arange(nr + 1)),
        wan_hops=cm.wan_latency_hops(spec.sync, np.arange(nr + 1)),
        per_leader=cm.wan_bytes_per_leader(spec.sync, n, np.arange(nr + 1)),
        xps=cm.exchanges_per_step(spec.sync, spec.training.steps),
        overlapped=cm.sync_overlapped(spec.sync),
        links=links,
        wan_param_s=n * cm.exchange_param_seconds(regions, calibration)
        + cm.exchange_fixed_seconds(regions, calibration),
        runtime=runtime_terms(spec),
        fixed_s=fixed_s,
        region_sets=region_sets,
        region_links=region_links,
        fill_links=fill_links,
        wan_orders=wan_orders,
        growth_orders=growth_orders,
    )


def _cluster_pools(entries: list[_ClassEntry]) -> dict[str, tuple[str, int]]:
    """Per cluster, its region and how many of the classes' pools it holds."""
    out: dict[str, tuple[str, int]] = {}
    for e in entries:
        region = e.cls.first.region
        for cid, n in e.per_cluster:
            out[cid] = (region, out.get(cid, (region, 0))[1] + n)
    return out


def _cluster_members(grouped: _Classes, ridx: dict[str, int]) -> np.ndarray:
    """Per region, the most pools one of its clusters holds (``Fleet.cluster_members``)."""
    most = np.zeros(len(ridx))
    for region, n in grouped.cluster_pools.values():
        r = ridx[region]
        most[r] = max(most[r], n)
    return most


@dataclass(frozen=True)
class _Pairs:
    """Between the regions of a pool list (R×R, by region index): what the sync cost reads."""

    links: Links
    bw: np.ndarray  # bytes/s, min of both directions (0: no link)
    lat: np.ndarray  # s, max of both directions
    egress: np.ndarray  # USD/GB from row region to column region


# Entries kept per snapshot for each kind of derived value (distinct QoS filters and calibrations).
KEPT_PER_SNAPSHOT = 32


def _kept(snapshot: ResourceSnapshot, kind: str, key: object, build: Callable[[], T]) -> T:
    """``build()`` kept with the snapshot under ``key`` (a few per kind, oldest dropped first):
    quotes on an unchanged fleet with the same filters and calibration reuse it."""
    cache: dict[object, T] = snapshot.derived(f"kept:{kind}", lambda _: {})
    got = cache.get(key)
    if got is None:
        if len(cache) >= KEPT_PER_SNAPSHOT:
            cache.pop(next(iter(list(cache))), None)  # list(): atomic under concurrent quotes
        got = cache[key] = build()
    return got


def _pairs(
    snapshot: ResourceSnapshot, calibration: Calibration | None, cal_key: str, regions: tuple[str, ...]
) -> _Pairs:
    def build() -> _Pairs:
        links = Links(snapshot, calibration)
        nr = len(regions)
        bw, lat, egress = (np.zeros((nr, nr)) for _ in range(3))
        for i, a in enumerate(regions):
            for j, b in enumerate(regions):
                if i != j:
                    bw[i, j] = min(links.bw(a, b), links.bw(b, a))
                    lat[i, j] = max(links.lat(a, b), links.lat(b, a))
                    egress[i, j] = links.egress(a, b)
        return _Pairs(links, bw, lat, egress)

    return _kept(snapshot, "pairs", (regions, cal_key), build)


# Classes whose worst start-up and teardown are kept per snapshot and calibration (cleared when full).
CLASS_FIXED_KEPT = 65536


def _fixed_seconds(
    snapshot: ResourceSnapshot, classes: list[PoolClass], calibration: Calibration | None, cal_key: str
) -> float:
    """The worst start-up and teardown among the classes' nodes, per idle core (see
    estimate._fixed_seconds; the search leaves the host's share out). Each class's figure is kept
    with the snapshot: pool lists of different quotes share their classes (``_class_entries``)."""
    kept: dict[tuple[int, str], tuple[PoolClass, float]] = snapshot.derived("class_fixed", lambda _: {})
    worst = 0.0
    for c in classes:
        got = kept.get((id(c), cal_key))
        if got is None or got[0] is not c:
            mine = 0.0
            for p in c.pools:
                for node_id, startup, teardown in p.measured_fixed:
                    mine = max(
                        mine,
                        cm.startup_seconds(node_id, startup, calibration)
                        + cm.teardown_seconds(node_id, teardown, calibration),
                    )
            if len(kept) >= CLASS_FIXED_KEPT:
                kept.clear()
            got = kept[(id(c), cal_key)] = (c, mine)
        worst = max(worst, got[1])
    return worst


@dataclass
class Problem:
    fleet: Fleet
    deg: Degrees
    n_micro: int
    # per unit
    units: list[PoolClass]
    count: np.ndarray  # members (nodes)
    cap: np.ndarray  # replicas one member can host
    lo: np.ndarray  # fewest replicas on a member for memory to fit (ZeRO shards); INFEASIBLE if never
    t1: np.ndarray  # step seconds of a replica alone on its member
    t2: np.ndarray  # ... sharing its member with one other (in-node gradient all-reduce of 2)
    price: np.ndarray  # USD per device-hour
    region: np.ndarray  # region index
    # sync constants indexed by number of participating regions R = 0..n_regions
    wan_factor: np.ndarray
    wan_hops: np.ndarray
    per_leader: np.ndarray
    xps: float  # exchanges per step
    overlapped: bool
    _t_shared_kept: dict[int, list[float]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_units(self) -> int:
        return len(self.units)

    def t_shared_one(self, u: int, replicas: int) -> float:
        """``t_shared`` of one unit: every unit's kept per replicas value (scoring asks for few
        values, over many units; the figures are element-wise, so each unit's is what it would
        get alone)."""
        row = self._t_shared_kept.get(replicas)
        if row is None:
            row = self._t_shared_kept[replicas] = self.t_shared(replicas).tolist()
        return row[u]

    def t_shared(self, replicas, units: slice = slice(None)) -> np.ndarray:
        """Per unit (of ``units``), the step of a replica on a member holding ``replicas`` (≥ 2):
        t1 plus the node's gradient ring of that many (``cm.dp_comm_s``)."""
        f = self.fleet
        bw, lat = f.cls_intra_bw[units], f.cls_intra_lat[units]
        ring = cm.dp_comm_s(f.spec, self.deg.tp, self.deg.pp, self.deg.zero, replicas, bw, lat)
        return self.t1[units] + ring

    @property
    def dev(self) -> int:
        return self.deg.devices_per_replica

    @property
    def usable(self) -> np.ndarray:
        """Units that can host at least one replica (memory may need lo of the dp on one member)."""
        return (self.lo <= np.minimum(self.cap, self.deg.dp)) & (self.cap >= 1) & (self.count >= 1)

    def capacity(self) -> int:
        return int((self.count * self.cap)[self.usable].sum())

    @cached_property
    def lists(self) -> UnitLists:
        f = self.fleet
        return UnitLists(
            count=self.count.tolist(),
            cap=self.cap.tolist(),
            lo=self.lo.tolist(),
            t1=self.t1.tolist(),
            t2=self.t2.tolist(),
            region=self.region.tolist(),
            first_cluster=f.cls_first_cluster.tolist(),
            port_bw=f.cls_port_bw.tolist(),
            hop_lat=f.cls_hop_lat.tolist(),
            local_bw=f.local_bw.tolist(),
            local_lat=f.local_lat.tolist(),
        )


@dataclass(frozen=True)
class UnitLists:
    """A problem's per-unit (and per-region) arrays as Python lists, for the scalar paths that
    walk a solution's units one at a time (numpy's per-call overhead dominates there)."""

    count: list[int]
    cap: list[int]
    lo: list[int]
    t1: list[float]
    t2: list[float]
    region: list[int]
    first_cluster: list[int]
    port_bw: list[float]
    hop_lat: list[float]
    local_bw: list[float]
    local_lat: list[float]


def _class_caps(fleet: Fleet, tp: int, pp: int) -> np.ndarray:
    """Replicas one member of each class can host: each sits whole on a node, Σ free // (tp·pp)."""
    return (fleet.cls_node_free // (tp * pp)).sum(axis=1)


def memory_by_replicas(spec: JobSpec, deg: Degrees, n_micro: int, most: int) -> np.ndarray:
    """Peak bytes per device with r = 1..``most`` replicas of a node in one torchrun group
    (``cost_model.memory_per_device``): ZeRO shards over them, DDP adds its buckets."""
    return np.array(
        [
            cm.memory_per_device(spec, deg.tp, deg.pp, deg.zero, r, n_micro, spec.pp_schedule).total
            for r in range(1, max(1, most) + 1)
        ]
    )


def fewest_replicas(need: np.ndarray, usable_bytes: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per unit, the fewest replicas r >= 1 a member can hold from which every count up to its
    cap fits: ``need[r - 1]`` bytes per device with r replicas in its group against its
    ``usable_bytes``. Memory need not fall with r (DDP's buckets come with a second replica;
    FSDP pads each shard), so every count is checked, not a formula. INFEASIBLE if none."""
    most = len(need)
    counts = np.arange(1, most + 1)
    fits = need[None, :] <= usable_bytes[:, None]
    # Counts past a member's cap are never asked for: they cannot make a smaller count unusable.
    fits |= counts[None, :] > np.maximum(np.asarray(cap), 1)[:, None]
    from_here = np.flip(np.logical_and.accumulate(np.flip(fits, axis=1), axis=1), axis=1)
    lo = from_here.argmax(axis=1) + 1
    within = from_here.any(axis=1) & (lo <= np.maximum(np.asarray(cap), 1))
    return np.where(within, lo, INFEASIBLE).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Layout:
    """The units of one (tp, pp) shape: what depends on the replica's shape but not on dp or ZeRO."""

    units: list[PoolClass]
    count: np.ndarray
    cap: np.ndarray
    flops: np.ndarray
    intra_bw: np.ndarray
    intra_lat: np.ndarray
    pp_bw: np.ndarray
    pp_lat: np.ndarray
    memory: np.ndarray
    price: np.ndarray
    region: np.ndarray

    speed_groups: np.ndarray  # units with equal speed, fabric and price (equal step times, rate)


def layout(fleet: Fleet, tp: int, pp: int) -> Layout:
    cached = fleet.layouts.get((tp, pp))
    if cached is not None:
        return cached
    out = Layout(
        units=list(fleet.classes),
        count=fleet.cls_count,
        cap=_class_caps(fleet, tp, pp),
        flops=fleet.cls_flops,
        intra_bw=fleet.cls_intra_bw,
        intra_lat=fleet.cls_intra_lat,
        pp_bw=fleet.cls_intra_bw,
        pp_lat=fleet.cls_intra_lat,
        memory=fleet.cls_memory,
        price=fleet.cls_price,
        region=fleet.cls_region,
        speed_groups=fleet.cls_group,
    )
    fleet.layouts[(tp, pp)] = out
    return out


def build_problem(fleet: Fleet, deg: Degrees) -> Problem:
    spec = fleet.spec
    tp, pp, zero = deg.tp, deg.pp, deg.zero
    n_micro = n_micro_batches(spec, deg.dp)
    lay = layout(fleet, tp, pp)
    args = (lay.flops, lay.intra_bw, lay.intra_lat, lay.pp_bw, lay.pp_lat)
    # The job's pipeline schedule, as its workers run it and the estimator prices it.
    sched = spec.pp_schedule
    # Alone, and two replicas on a node: the smallest gradient ring. The bounds, fills and MILP
    # rank by it; ``evaluate`` prices the ring of the replicas a solution puts on each node
    # (``t_shared``).
    t1, t2 = cm.replica_totals(spec, tp, pp, zero, n_micro, (1, 2), *args, schedule=sched)
    need = memory_by_replicas(spec, deg, n_micro, int(lay.cap.max(initial=1)))
    lo = fewest_replicas(need, cm.USABLE_MEMORY_FRACTION * lay.memory * cm.GB, lay.cap)
    ones = np.ones(len(lay.units))
    return Problem(
        fleet=fleet,
        deg=deg,
        n_micro=n_micro,
        units=lay.units,
        count=lay.count,
        cap=lay.cap,
        lo=lo,
        t1=np.asarray(t1, dtype=float) * ones,
        t2=np.asarray(t2, dtype=float) * ones,
        price=lay.price,
        region=lay.region,
        wan_factor=fleet.wan_factor,
        wan_hops=fleet.wan_hops,
        per_leader=fleet.per_leader,
        xps=fleet.xps,
        overlapped=fleet.overlapped,
    )


@dataclass(frozen=True)
class Solution:
    """Per unit: members with one replica (n1), members with ≥ 2 (n2) and their replicas (x2)."""

    n1: tuple[int, ...]
    n2: tuple[int, ...]
    x2: tuple[int, ...]
    # The units it uses (ascending), where its maker knows them: scoring then skips the others.
    units: tuple[int, ...] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Score:
    step_s: float
    t_local: float
    t_sync: float
    devices_cost: float
    egress_cost: float
    steps: int
    fixed_s: float = 0.0  # start-up, the final exchange where overlapped, teardown

    @property
    def cost(self) -> float:
        return self.devices_cost + self.egress_cost

    @property
    def duration_s(self) -> float:
        return self.fixed_s + self.step_s * self.steps


# Region sets whose links are kept per pool list and calibration (cleared when full).
REGION_LINKS_KEPT = 65536


def region_links(f: Fleet, regions: tuple[int, ...]) -> tuple[float, float, float]:
    """Among two or more regions (ascending indices): the slowest link (bytes/s), the highest
    latency, and the sum over the regions of their dearest egress price to another (USD/GB).
    Kept with the fleet: solutions scored in a quote, and later quotes, meet the same sets."""
    got = f.region_links.get(regions)
    if got is None:
        idx = np.array(regions, dtype=np.int64)
        sub = np.ix_(idx, idx)
        off = ~np.eye(len(idx), dtype=bool)
        got = (
            float(f.pair_bw[sub][off].min()),
            float(f.pair_lat[sub][off].max()),
            float(np.where(off, f.egress[sub], -np.inf).max(axis=1).sum()),
        )
        if len(f.region_links) >= REGION_LINKS_KEPT:
            f.region_links.clear()
        f.region_links[regions] = got
    return got


def sync_seconds_and_egress(pr: Problem, units: list[int], used: list[int]) -> tuple[float, float]:
    """Seconds and USD of one exchange given the units in use (ascending) and the members (nodes, one
    participant each) each uses: the estimator's flat ring (``sync_cost.sync_cost``) over the hops
    it takes, or its hierarchical exchange where that is faster. Within a region, nodes of one
    unit that fit in its first cluster meet over that cluster's fabric; otherwise the region's
    nodes span clusters and its slowest hop is its local link and the fabric of every cluster
    holding two or more of its nodes. A unit's members fill its first cluster first, and that
    cluster holds the most of them: two of its nodes share a cluster when it uses two or more and
    its first cluster has two or more (twin clusters of one node each meet over the local link
    alone, as the runtime's ring crosses it), and two units share their first cluster when its
    index is the same (as ``milp`` takes it). Plain Python over the units in use: the search
    scores thousands of solutions per quote."""
    f = pr.fleet
    lists = pr.lists
    members: dict[int, int] = {}
    by_region: dict[int, list[int]] = {}
    for u, m in zip(units, used, strict=True):
        r = lists.region[u]
        members[r] = members.get(r, 0) + m
        by_region.setdefault(r, []).append(u)
    p_count = sum(members.values())
    if p_count < 2:
        return 0.0, 0.0
    bw_min, lat_max = math.inf, 0.0
    of = dict(zip(units, used, strict=True))
    gather = 0.0  # the slowest region's gather into its head (hierarchical)
    n = float(f.spec.model.n_params)
    for r, here in by_region.items():
        if members[r] < 2:
            continue
        # Every unit within its first cluster, and that one cluster for all: its fabric alone.
        if len({f.cls_first_cid[u] for u in here}) == 1 and all(
            of[u] <= lists.first_cluster[u] for u in here
        ):
            r_bw, r_lat = min(lists.port_bw[u] for u in here), max(lists.hop_lat[u] for u in here)
        else:
            r_bw, r_lat = lists.local_bw[r], lists.local_lat[r]
            firsts: set[int] = set()
            for u in here:
                # Two of its nodes in its first cluster, or a node there beside another unit's first.
                cid = int(f.cls_first_cid[u])
                if (of[u] >= 2 and lists.first_cluster[u] >= 2) or cid in firsts:
                    r_bw, r_lat = min(r_bw, lists.port_bw[u]), max(r_lat, lists.hop_lat[u])
                firsts.add(cid)
        bw_min, lat_max = min(bw_min, r_bw), max(lat_max, r_lat)
        gather = max(gather, float(cm.region_gather_s(f.spec.sync, n, members[r], r_bw, r_lat)))
    multi = len(members) >= 2
    egress = 0.0
    dearest = 0.0
    if multi:
        pair_bw, pair_lat, dearest = region_links(f, tuple(sorted(members)))
        bw_min = min(bw_min, pair_bw)
        lat_max = max(lat_max, pair_lat)
        per = f.exchange_memo.get(("bytes", p_count))
        if per is None:
            per = float(cm.wan_bytes_per_leader(f.spec.sync, float(f.spec.model.n_params), p_count))
            f.exchange_memo[("bytes", p_count)] = per
        egress = per / cm.GB * dearest
    if bw_min <= 0:
        return math.inf, math.inf
    key = (p_count, bw_min, lat_max)
    t = f.exchange_memo.get(key)
    if t is None:
        t = float(cm.ring_sync_s(f.spec.sync, float(f.spec.model.n_params), p_count, bw_min, lat_max))
        f.exchange_memo[key] = t
    largest = max(members.values())
    if multi and largest >= 2 and f.spec.sync.mode in cm.HIERARCHICAL_MODES:
        # The estimator's choice (``sync_cost.sync_cost``): the hierarchical exchange where it is faster.
        groups = len(members)
        local, wan = cm.hierarchical_parts(f.spec.sync, n, groups, gather, pair_bw, pair_lat)
        hier = float(local) + float(wan)
        if cm.hierarchical_pays(f.spec.sync, groups, largest, t, hier):
            t = hier
            egress = float(cm.wan_bytes_per_leader(f.spec.sync, n, groups)) / cm.GB * dearest
    t += f.wan_param_s  # the exchange's fixed cost and the leaders' per-parameter work, every exchange
    return t, egress


def local_share(fleet: Fleet, t: np.ndarray) -> np.ndarray:
    """A local step time t plus the checkpoint writes per step its runtime settings give it and
    the run's fixed seconds (start-up, teardown) spread over its steps: what the lower bounds and
    the MILP, which see step times only, rank by. Rises with t."""
    return t + checkpoint_s_per_step(fleet.runtime, t) + fleet.fixed_s / fleet.spec.training.steps


def runtime_step(pr: Problem, t_local, t_sync, participants) -> tuple[np.ndarray, np.ndarray]:
    """(step seconds, final exchange seconds) of placements with local step ``t_local`` and one
    exchange of ``t_sync``, priced with the runtime settings the workers would get: checkpoint
    writes at the policy's interval and the exposed part of an overlapped exchange (the
    estimator's rules, ``runtime_pricing``). Vectorised over placements."""
    terms = pr.fleet.runtime
    t_step = t_local + checkpoint_s_per_step(terms, t_local)
    hidden = overlaps(terms, participants)
    delay = delay_steps(terms, t_sync, t_local)
    # An overlapped exchange hides behind the steps' work, not the amortised checkpoint writes:
    # a write comes once in many rounds (and the last one, waited for, after the last exchange).
    wan = wan_per_step(terms, t_sync, t_local, hidden, delay, terms.fragments)
    return t_step + wan, final_sync_s(terms, t_sync, hidden, participants)


def evaluate(pr: Problem, sol: Solution) -> Score | None:
    """Step time and cost of a unit-level solution; None when it breaks a structural rule."""
    return evaluate_many(pr, [sol])[0]


@dataclass(frozen=True)
class _Shape:
    """What pricing a solution needs from its units."""

    units: list[int]  # the units it uses, ascending
    t_local: float
    t_sync: float
    egress: float
    participants: int


def _shape(pr: Problem, sol: Solution) -> _Shape | None:
    """Walks only the units the solution uses (a unit it leaves empty breaks no rule and adds
    nothing), in plain Python numbers: the search scores thousands of solutions per quote."""
    lists = pr.lists
    units: list[int] = []
    total = 0
    t1_max = t2_max = None
    n1, n2, x2 = sol.n1, sol.n2, sol.x2
    for u in range(len(n1)) if sol.units is None else sol.units:
        a, b, c = n1[u], n2[u], x2[u]
        if not (a or b or c):
            continue
        if a < 0 or b < 0 or a + b > lists.count[u] or (a > 0 and lists.lo[u] > 1):
            return None
        if c < (b * max(2, lists.lo[u]) if b > 0 else 0) or c > b * lists.cap[u]:
            return None
        if a > 0:
            t1_max = lists.t1[u] if t1_max is None else max(t1_max, lists.t1[u])
        if b > 0:
            # The unit's b members share its c replicas as ``assign`` deals them: the fullest
            # holds ⌈c/b⌉ and runs the node's gradient ring of that many.
            t2 = pr.t_shared_one(u, -(-c // b))
            t2_max = t2 if t2_max is None else max(t2_max, t2)
        total += a + c
        units.append(u)
    if total != pr.deg.dp:
        return None
    t_local = max(0.0 if t1_max is None else t1_max, 0.0 if t2_max is None else t2_max)
    in_use = [u for u in units if sol.n1[u] + sol.n2[u] > 0]
    members = [sol.n1[u] + sol.n2[u] for u in in_use]
    t_sync, egress = sync_seconds_and_egress(pr, in_use, members)
    if not math.isfinite(t_sync):
        return None
    return _Shape(units, t_local, t_sync, egress, sum(members))


def evaluate_many(pr: Problem, sols: list[Solution]) -> list[Score | None]:
    """``evaluate`` over several solutions of one problem: the runtime pricing (vectorised over
    placements, element by element) runs once for all of them."""
    shapes = [_shape(pr, sol) for sol in sols]
    ok = [sh for sh in shapes if sh is not None]
    if not ok:
        return [None] * len(sols)
    step, final = runtime_step(
        pr,
        np.array([sh.t_local for sh in ok]),
        np.array([sh.t_sync for sh in ok]),
        np.array([sh.participants for sh in ok]),
    )
    step, final = np.broadcast_to(step, (len(ok),)), np.broadcast_to(final, (len(ok),))
    f = pr.fleet
    steps = f.spec.training.steps
    out: list[Score | None] = []
    k = 0
    for sol, sh in zip(sols, shapes, strict=True):
        if sh is None:
            out.append(None)
            continue
        st, fin = float(step[k]), float(final[k])
        k += 1
        fixed = f.fixed_s + fin
        # A dense sum, as over every unit: the same rounding whichever units a solution uses.
        replicas = np.zeros(pr.n_units, dtype=np.int64)
        replicas[sh.units] = [sol.n1[u] + sol.x2[u] for u in sh.units]
        rate = float((pr.price * replicas).sum()) * pr.dev
        devices_cost = (fixed + steps * st) * rate / 3600.0
        egress_cost = steps * pr.xps * sh.egress
        out.append(Score(st, sh.t_local, sh.t_sync, devices_cost, egress_cost, steps, fixed))
    return out
