"""The usable fleet: free devices grouped into pools, after the QoS filters, with what each removed."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from contracts.job_spec import JobSpec
from contracts.registration import runs_user_code
from control_layer.planner.estimate import device_price
from control_layer.planner.snapshot import ClusterInfo, DeviceSlot, NodeInfo, ResourceSnapshot


@dataclass(frozen=True, eq=False)
class Pool:
    """The free devices of one device model on one node.

    A node is the unit the runtime runs: one torchrun group per node, so a replica, its ZeRO
    shard group and its every-step gradient all-reduce stay on one node; nodes, even of one
    cluster, meet through the job's sync. tflops and memory_gb are the weakest device's, so any
    replica placed here gets at least them.
    """

    cluster: ClusterInfo
    model: str
    nodes: tuple[tuple[str, tuple[int, ...]], ...]  # ((node id, free device indices),)
    tflops: float
    memory_gb: float
    price: float  # USD per device-hour in force for this job (spot where allowed)
    kind: str = "cuda"  # "cuda" | "cpu": what the precision resolves against
    free_per_node: tuple[int, ...] = ()
    n_free: int = 0
    region: str = ""
    # Per node: start-up and teardown per idle core as measured at registration (None: not
    # measured); derived here once, as pools are kept across quotes.
    measured_fixed: tuple[tuple[str, float | None, float | None], ...] = ()
    # Its node's port into the cluster fabric (``ClusterInfo.port``: Gb/s, one-way ms), where its
    # node declared its own; None: the cluster's figures. Exchanges between nodes cross it.
    port: tuple[float, float] | None = None

    @property
    def port_figures(self) -> tuple[float, float]:
        """(Gb/s, one-way ms) of a device's port into the fabric on this pool's node."""
        if self.port is not None:
            return self.port
        return self.cluster.intra_bandwidth_gbps, self.cluster.intra_latency_ms

    def __post_init__(self) -> None:
        counts = tuple(len(ix) for _, ix in self.nodes)
        object.__setattr__(self, "free_per_node", counts)
        object.__setattr__(self, "n_free", sum(counts))
        object.__setattr__(self, "region", self.cluster.region)
        if not self.measured_fixed:  # a caller that built the pool node by node hands it over
            mine = {node_id for node_id, _ in self.nodes}
            fixed = tuple(_measured_fixed(n) for n in self.cluster.nodes if n.id in mine)
            object.__setattr__(self, "measured_fixed", fixed)

    @functools.cached_property
    def class_key(self) -> tuple:
        """Pools with equal keys are interchangeable for the search (``problem.PoolClass``)."""
        c = self.cluster
        return (
            self.region,
            self.model,
            self.kind,
            self.price,
            self.tflops,
            self.memory_gb,
            c.intra_bandwidth_gbps,
            c.intra_latency_ms,
            tuple(sorted(self.free_per_node, reverse=True)),
            self.port_figures,
        )


def _measured_fixed(node: NodeInfo) -> tuple[str, float | None, float | None]:
    prof = node.profile
    if prof is None:
        return (node.id, None, None)
    under = max(1.0, prof.host_load_factor)
    # The profile's start-up is per idle core already (CPU time, agent/profile.py).
    return (node.id, prof.startup_s, prof.teardown_s / under)


@dataclass
class Filtered:
    pools: list[Pool]
    steps: list[dict[str, Any]] = field(default_factory=list)


# A cluster's pools depend on that ClusterInfo alone, and snapshots are never changed in place; the
# server's live snapshot hands out the same object for a cluster until it changes, so a quote
# regroups only the clusters that changed since the last one. Entries hold their cluster, so an
# id cannot be reused while cached.
_POOL_CACHE: OrderedDict[tuple[int, bool], tuple[ClusterInfo, list[Pool]]] = OrderedDict()
_POOL_CACHE_SIZE = 16_384
_POOL_CACHE_LOCK = threading.Lock()


_FLEET_POOLS: OrderedDict[tuple[int, bool], tuple[ResourceSnapshot, list[Pool]]] = OrderedDict()


def prepare_pools(snapshot: ResourceSnapshot, spot: bool) -> list[Pool]:
    """Build and keep the snapshot's pools at one price setting ahead of its first quote."""
    return _pools(snapshot, spot)


def _pools(snapshot: ResourceSnapshot, spot: bool) -> list[Pool]:
    """Every free pool of the snapshot, remembered for the last few snapshot objects."""
    key = (id(snapshot), spot)
    with _POOL_CACHE_LOCK:
        hit = _FLEET_POOLS.get(key)
    if hit is not None and hit[0] is snapshot:
        return list(hit[1])
    out = _fleet_pools(snapshot, spot)
    with _POOL_CACHE_LOCK:
        _FLEET_POOLS[key] = (snapshot, out)
        while len(_FLEET_POOLS) > 4:
            _FLEET_POOLS.popitem(last=False)
    return list(out)


def _fleet_pools(snapshot: ResourceSnapshot, spot: bool) -> list[Pool]:
    out: list[Pool] = []
    for cluster in sorted(snapshot.clusters, key=lambda c: c.id):
        key = (id(cluster), spot)
        with _POOL_CACHE_LOCK:
            hit = _POOL_CACHE.get(key)
            if hit is not None and hit[0] is cluster:
                _POOL_CACHE.move_to_end(key)
        if hit is not None and hit[0] is cluster:
            out.extend(hit[1])
            continue
        with _POOL_CACHE_LOCK:
            other = _POOL_CACHE.get((id(cluster), not spot))
        if other is not None and other[0] is cluster:
            # The same devices at the other price setting: only the price can differ.
            price = device_price(cluster, spot)
            pools = [p if p.price == price else _repriced(p, price) for p in other[1]]
        else:
            pools = _cluster_pools(cluster, spot)
        with _POOL_CACHE_LOCK:
            _POOL_CACHE[key] = (cluster, pools)
            while len(_POOL_CACHE) > _POOL_CACHE_SIZE:
                _POOL_CACHE.popitem(last=False)
        out.extend(pools)
    return out


def _repriced(p: Pool, price: float) -> Pool:
    # As dataclasses.replace, without its per-field introspection (thousands of pools per fleet).
    fixed = p.measured_fixed
    return Pool(
        p.cluster, p.model, p.nodes, p.tflops, p.memory_gb, price, p.kind, measured_fixed=fixed, port=p.port
    )


def island_order(devices: list[DeviceSlot]) -> tuple[int, ...]:
    """A node's free device indices with each NVLink island's together, in index order inside it.
    A replica takes its tp·pp devices as consecutive ones (``assign._pool_replicas``), TP ranks
    innermost, so its TP groups stay inside an island wherever the islands' sizes allow: TP
    all-reduces every layer, over PCIe an order of magnitude slower than over NVLink. Devices of
    no known island (-1: CPU slots, GPU nodes without NVML) keep plain index order."""
    return tuple(d.index for d in sorted(devices, key=lambda d: (d.link_group, d.index)))


def _cluster_pools(cluster: ClusterInfo, spot: bool) -> list[Pool]:
    out = []
    price = device_price(cluster, spot)
    # This runs over every device of a cluster: comprehensions, and a fast path for the usual
    # node whose free devices are all one model.
    for node in cluster.nodes:
        if not node.alive:
            continue
        free = [d for d in node.devices if d.free]
        if not free:
            continue
        models = {(d.model, d.kind) for d in free}
        fixed = (_measured_fixed(node),)  # not a walk over the cluster's nodes per pool
        declared = node.fabric_bandwidth_gbps is not None or node.fabric_latency_ms is not None
        port = cluster.port(node) if declared else None
        for m in sorted(models):
            mine = free if len(models) == 1 else [d for d in free if (d.model, d.kind) == m]
            ix = island_order(mine)
            tflops = min([d.tflops for d in mine])
            memory = min([d.memory_gb for d in mine])
            out.append(
                Pool(
                    cluster,
                    m[0],
                    ((node.id, ix),),
                    tflops,
                    memory,
                    price,
                    m[1],
                    measured_fixed=fixed,
                    port=port,
                )
            )
    return out


def shard_regions(spec: JobSpec) -> set[str] | None:
    """The regions the job may use because of its shards: with every shard resident, only theirs;
    None where the data does not restrict regions (a non-resident shard may go anywhere)."""
    shards = spec.data.shards
    if not shards or not all(s.resident for s in shards.values()):
        return None
    return set(shards)


def filter_fleet(spec: JobSpec, snapshot: ResourceSnapshot) -> Filtered:
    """Apply the QoS and data constraints one by one, recording what each removed."""
    qos = spec.qos
    pools = _pools(snapshot, qos.preemptible)
    total_devices = sum(p.n_free for p in pools)
    result = Filtered(pools)
    result.steps.append(
        {
            "constraint": "free devices",
            "detail": f"{total_devices} free devices on alive nodes in {len(snapshot.clusters)} clusters",
            "left_devices": total_devices,
        }
    )

    def apply(constraint: str, value: Any, keep, why: str) -> None:
        kept, removed = [], []
        for p in result.pools:
            (kept if keep(p) else removed).append(p)
        if removed:
            result.steps.append(
                {
                    "constraint": constraint,
                    "value": value,
                    "removed_clusters": len({p.cluster.id for p in removed}),
                    "removed_devices": sum(p.n_free for p in removed),
                    "left_devices": sum(p.n_free for p in kept),
                    "detail": why,
                }
            )
        result.pools = kept

    if qos.regions is not None:
        allowed = set(qos.regions)
        apply("qos.regions", sorted(allowed), lambda p: p.region in allowed, "region not in the allowed list")
    if qos.exclude_regions:
        excluded = set(qos.exclude_regions)
        apply("qos.exclude_regions", sorted(excluded), lambda p: p.region not in excluded, "region excluded")
    if qos.data_residency:
        want = qos.data_residency.upper()
        present = {p.region for p in result.pools}
        inside = {r for r in present if snapshot.jurisdiction(r).upper() == want}
        why = f"region outside jurisdiction {qos.data_residency}"
        unapproved = sorted(r for r in present - inside if snapshot.jurisdiction_claim(r).upper() == want)
        if unapproved:
            why += f" ({unapproved} only claim it: no admin has approved their jurisdiction yet)"
        apply("qos.data_residency", qos.data_residency, lambda p: p.region in inside, why)
    if spec.data.region:
        home = spec.data.region
        apply(
            "data.region",
            home,
            lambda p: p.region == home,
            f"data lives in {home}; its readers must run there",
        )
    home_regions = shard_regions(spec)
    if home_regions is not None:
        apply(
            "data.shards",
            sorted(home_regions),
            lambda p: p.region in home_regions,
            "every shard is resident and this region holds none: no data could be read there",
        )
    if qos.accelerators:
        kinds = [a.lower() for a in qos.accelerators]
        allowed = {m for m in {p.model for p in result.pools} if any(k in m.lower() for k in kinds)}
        apply(
            "qos.accelerators",
            qos.accelerators,
            lambda p: p.model in allowed,
            "device model not allowed",
        )
    if qos.min_gpu_mem_gb is not None:
        need = qos.min_gpu_mem_gb
        apply("qos.min_gpu_mem_gb", need, lambda p: p.memory_gb >= need, f"device memory below {need:g} GB")
    if spec.entrypoint is not None:
        # Users' code runs only where the node confines it, or its provider accepts it unconfined.
        closed = {n.id for c in snapshot.clusters for n in c.nodes if not runs_user_code(n.sandbox)}
        apply(
            "entrypoint",
            spec.entrypoint,
            lambda p: not any(node_id in closed for node_id, _ in p.nodes),
            "node runs no users' code (no working sandbox, and its provider has not allowed it unsandboxed)",
        )
    return result
