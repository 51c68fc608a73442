"""Build the planner's ResourceSnapshot from the database: what is alive, free and priced right now."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_layer.planner.snapshot import (
    ClusterInfo,
    DeviceSlot,
    LinkInfo,
    NodeInfo,
    NodeProfileInfo,
    RegionInfo,
    ResourceSnapshot,
)
from orchestration.db.base import utcnow
from orchestration.db.models import Accelerator, Allocation, Cluster, Node, Price, Provider, Region
from resource_layer.link_probes import current_links
from resource_layer.link_view import EffectiveLink

DEFAULT_LINK_FRESH_S = 1800.0  # Settings.effective_link_fresh_s by default: 3 x the 600 s probe interval


def current_prices(session: Session, cluster_ids: list[str] | None = None) -> dict[str, Price]:
    """The price row in force per cluster: the newest whose effective_from is not in the future."""
    stmt = select(Price).where(Price.effective_from <= utcnow())
    if cluster_ids is not None:
        stmt = stmt.where(Price.cluster_id.in_(cluster_ids))
    newest: dict[str, Price] = {}
    for row in session.scalars(stmt.order_by(Price.cluster_id, Price.effective_from)):
        newest[row.cluster_id] = row  # ordered ascending, so the last one wins
    return newest


def node_profile(raw: dict[str, Any] | None) -> NodeProfileInfo | None:
    """A node's stored measured profile; None when it has none or one this planner cannot read."""
    if not raw:
        return None
    try:
        return NodeProfileInfo.model_validate(raw)
    except ValidationError:
        return None


def busy_accelerator_ids(session: Session) -> set[str]:
    return set(session.scalars(select(Allocation.accelerator_id).where(Allocation.active.is_(True))))


def link_info(ln: EffectiveLink) -> LinkInfo:
    """The planner's view of a link in force (``resource_layer.link_view``)."""
    return LinkInfo(
        src=ln.src,
        dst=ln.dst,
        bandwidth_gbps=ln.bandwidth_gbps,
        latency_ms=ln.latency_ms,
        egress_price_per_gb=ln.egress_price_per_gb,
        source=ln.source,  # type: ignore[arg-type]
        private=ln.private,
    )


def region_info(region: Region) -> RegionInfo:
    """The planner's view of a region: its jurisdiction only where an admin approved it (data
    residency trusts nothing else); an agent's unapproved claim is carried apart, for the reasons."""
    if region.jurisdiction_approved:
        return RegionInfo(name=region.name, jurisdiction=region.jurisdiction)
    return RegionInfo(name=region.name, jurisdiction_claim=region.jurisdiction)


def build_snapshot(
    session: Session, *, exclude_nodes: Collection[str] = (), link_fresh_s: float = DEFAULT_LINK_FRESH_S
) -> ResourceSnapshot:
    """Alive nodes without an operator's cordon only; a device is free iff it has no active
    allocation; clusters without a price or without such a node are left out (nothing could be
    planned on them). ``exclude_nodes`` are
    left out too (a job's re-placement avoids the nodes its tasks failed on). Link measurements
    older than ``link_fresh_s`` give way to the declared links."""
    busy = busy_accelerator_ids(session)
    prices = current_prices(session)
    providers = {p.id: p.name for p in session.scalars(select(Provider))}

    devices_by_node: dict[str, list[DeviceSlot]] = defaultdict(list)
    alive_nodes = [
        n
        for n in sorted(
            session.scalars(select(Node).where(Node.status == "alive", Node.cordon == "")), key=lambda n: n.id
        )
        if n.id not in exclude_nodes
    ]
    node_ids = [n.id for n in alive_nodes]
    accelerators = session.scalars(
        select(Accelerator).where(Accelerator.node_id.in_(node_ids)).order_by(Accelerator.index)
    )
    for acc in accelerators:
        if acc.memory_gb <= 0 or acc.measured_tflops <= 0:
            continue  # not measured (yet): the planner cannot estimate anything on it
        devices_by_node[acc.node_id].append(
            DeviceSlot(
                index=acc.index,
                model=acc.model,
                memory_gb=acc.memory_gb,
                tflops=acc.measured_tflops,
                free=acc.id not in busy,
                kind=acc.kind,
            )
        )

    nodes_by_cluster: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in alive_nodes:
        nodes_by_cluster[node.cluster_id].append(
            NodeInfo(
                id=node.id,
                hostname=node.hostname,
                devices=devices_by_node.get(node.id, []),
                profile=node_profile(node.profile),
                cpu_contention=node.cpu_contention,
                cpu_contention_busy=node.cpu_contention_busy,
                fabric_bandwidth_gbps=node.fabric_bandwidth_gbps,
                fabric_latency_ms=node.fabric_latency_ms,
                cross_cluster_groups=bool(node.cross_cluster_host),
                sandbox=node.sandbox,
            )
        )

    clusters: list[ClusterInfo] = []
    # Sorted here, not by the database, so both backends (and the live snapshot) agree on order.
    rows = sorted(session.scalars(select(Cluster)), key=lambda c: (c.region, c.name, c.id))
    for cluster in rows:
        price = prices.get(cluster.id)
        if price is None or not nodes_by_cluster.get(cluster.id):
            continue
        clusters.append(
            ClusterInfo(
                id=cluster.id,
                name=cluster.name,
                provider=providers.get(cluster.provider_id, ""),
                region=cluster.region,
                nodes=nodes_by_cluster[cluster.id],
                intra_bandwidth_gbps=cluster.intra_bandwidth_gbps,
                intra_latency_ms=cluster.intra_latency_ms,
                price_per_device_hour=price.price_per_device_hour,
                spot_price_per_device_hour=price.spot_price_per_device_hour,
            )
        )

    regions = [region_info(r) for r in sorted(session.scalars(select(Region)), key=lambda r: r.name)]
    # Measured where a fresh probe exists, else as an admin declared it (resource_layer.link_view).
    links = [
        link_info(ln)
        for ln in sorted(current_links(session, link_fresh_s), key=lambda ln: (ln.src, ln.dst))
        if ln.bandwidth_gbps > 0
    ]
    return ResourceSnapshot(regions=regions, clusters=clusters, links=links, taken_at=time.time())
