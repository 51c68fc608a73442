"""Build the planner's ResourceSnapshot from the database: what is alive, free and priced right now.

One builder serves both paths. ``FleetRows`` holds the fleet's rows as plain data and assembles
the snapshot from them; ``build_snapshot`` loads every row and assembles once (``GET
/v1/snapshot``, elastic re-placement, a process that keeps no live snapshot), while the live
snapshot (``control_layer/live_snapshot.py``) keeps one ``FleetRows`` and re-reads only the rows
the resource change feed names.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
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
from orchestration.db.engine import as_utc
from orchestration.db.models import Accelerator, Allocation, Cluster, Node, Price, Provider, Region
from orchestration.resource_changes import ResourceChanges
from resource_layer.link_probes import current_links
from resource_layer.link_view import EffectiveLink

DEFAULT_LINK_FRESH_S = 1800.0  # Settings.effective_link_fresh_s by default: 3 x the 600 s probe interval
LINK_RECHECK_S = 10.0  # links are few; re-reading them this often bounds how late a stale probe drops
_CHUNK = 900  # ids per IN (...) list: far below SQLite's and PostgreSQL's parameter limits


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


def measuring_nodes(session: Session) -> int:
    """Nodes alive and uncordoned that wait only for their profile: capacity about to be offered."""
    return (
        session.scalar(
            select(func.count())
            .select_from(Node)
            .where(Node.measuring.is_(True), Node.status == "alive", Node.cordon == "")
        )
        or 0
    )


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
    """The fleet read in full (``FleetRows._build_cluster`` decides what a cluster holds).
    ``exclude_nodes`` are left out too (a job's re-placement avoids the nodes its tasks failed
    on). Link measurements older than ``link_fresh_s`` give way to the declared links."""
    rows = FleetRows(link_fresh_s=link_fresh_s)
    rows.load_all(session)
    return rows.snapshot(exclude_nodes)


@dataclass(frozen=True)
class _ClusterRow:
    name: str
    region: str
    provider_id: str
    intra_bandwidth_gbps: float
    intra_latency_ms: float


@dataclass(frozen=True)
class _NodeRow:
    cluster_id: str
    hostname: str
    alive: bool  # and placeable: not cordoned, not measuring its profile
    profile: NodeProfileInfo | None
    cpu_contention: float | None
    fabric_bandwidth_gbps: float | None = None
    fabric_latency_ms: float | None = None
    cross_cluster_groups: bool = False
    cpu_contention_busy: float | None = None
    sandbox: str = "none"
    devices_unavailable: int = 0  # a scheduler-backed node's devices its cluster's users hold now
    queue_wait_s: float = 0.0  # and the wait in its cluster's queue for a task submitted now


@dataclass(frozen=True)
class _DeviceRow:
    id: str
    index: int
    model: str
    kind: str
    memory_gb: float
    tflops: float
    link_group: int = -1


@dataclass
class FleetRows:
    """The fleet's rows as plain data, and the ClusterInfo built from them (rebuilt when dirty):
    loaded in full (``load_all``) or row by row as the change feed names them (``apply``), and
    assembled into the planner's snapshot (``snapshot``) the same way either way."""

    regions: dict[str, RegionInfo] = field(default_factory=dict)
    links: list[LinkInfo] = field(default_factory=list)
    providers: dict[str, str] = field(default_factory=dict)
    clusters: dict[str, _ClusterRow] = field(default_factory=dict)
    prices: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    next_price_at: datetime | None = None  # a price row that comes into force later
    nodes: dict[str, _NodeRow] = field(default_factory=dict)
    cluster_nodes: dict[str, set[str]] = field(default_factory=dict)
    devices: dict[str, list[_DeviceRow]] = field(default_factory=dict)
    device_node: dict[str, str] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    built: dict[str, ClusterInfo | None] = field(default_factory=dict)
    order: list[ClusterInfo] | None = None
    stale: set[str] = field(default_factory=set)  # clusters whose ClusterInfo must be rebuilt
    loaded_at: float = 0.0
    rebuilt: int = 0  # ClusterInfos built since the heap was last settled
    whole: ResourceSnapshot | None = None  # handed out again while nothing changes
    link_fresh_s: float = DEFAULT_LINK_FRESH_S
    links_read_at: float = 0.0

    # -- reading rows ------------------------------------------------------------------------------

    def load_all(self, session: Session) -> None:
        self._topology(session)
        self._clusters(session, None)
        self._prices(session)
        self._nodes(session, None)
        self.loaded_at = time.monotonic()

    def apply(self, session: Session, changes: ResourceChanges) -> None:
        if changes.topology:
            self._topology(session)
        elif self.links_due():
            self._links(session)
        if changes.clusters:
            self._clusters(session, changes.clusters)
            self._prices(session)
        if self.next_price_at is not None and utcnow() >= self.next_price_at:
            self._prices(session)
        nodes = set(changes.nodes)
        unknown: set[str] = set()
        for acc in changes.accelerators:
            if (node := self.device_node.get(acc)) is not None:
                nodes.add(node)
            else:
                unknown.add(acc)
        for chunk in _chunks(unknown):
            nodes.update(session.scalars(select(Accelerator.node_id).where(Accelerator.id.in_(chunk))))
        if nodes:
            self._nodes(session, nodes)

    def _topology(self, session: Session) -> None:
        self.regions = {r.name: region_info(r) for r in session.scalars(select(Region))}
        self._links(session)
        self.whole = None
        providers = {p.id: p.name for p in session.scalars(select(Provider))}
        renamed = {pid for pid, name in self.providers.items() if providers.get(pid) != name}
        self.providers = providers
        self.stale.update(cid for cid, row in self.clusters.items() if row.provider_id in renamed)

    def _links(self, session: Session) -> None:
        # Measured where a fresh probe exists, else as declared (resource_layer.link_probes).
        self.links = sorted(
            (link_info(ln) for ln in current_links(session, self.link_fresh_s) if ln.bandwidth_gbps > 0),
            key=lambda ln: (ln.src, ln.dst),
        )
        self.links_read_at = time.monotonic()
        self.whole = None

    def links_due(self) -> bool:
        """A measurement may have aged out since the links were read: freshness is a matter of time."""
        return time.monotonic() - self.links_read_at > LINK_RECHECK_S

    def _clusters(self, session: Session, ids: Collection[str] | None) -> None:
        if ids is None:
            rows = list(session.scalars(select(Cluster)))
            self.clusters.clear()
        else:
            rows = [
                r
                for chunk in _chunks(ids)
                for r in session.scalars(select(Cluster).where(Cluster.id.in_(chunk)))
            ]
            for cid in ids:
                self.clusters.pop(cid, None)
                self.stale.add(cid)
        for c in rows:
            self.clusters[c.id] = _ClusterRow(
                c.name, c.region, c.provider_id, c.intra_bandwidth_gbps, c.intra_latency_ms
            )
            self.stale.add(c.id)
        self.order = None

    def _prices(self, session: Session) -> None:
        """All clusters' prices in force (one query; a price is a few numbers per cluster)."""
        now = utcnow()
        prices: dict[str, tuple[float, float | None]] = {}
        rows = session.execute(
            select(Price.cluster_id, Price.price_per_device_hour, Price.spot_price_per_device_hour)
            .where(Price.effective_from <= now)
            .order_by(Price.cluster_id, Price.effective_from)
        )
        for cid, price, spot in rows:
            prices[cid] = (price, spot)  # ascending: the newest in force wins
        upcoming = session.scalar(select(func.min(Price.effective_from)).where(Price.effective_from > now))
        self.next_price_at = as_utc(upcoming) if upcoming is not None else None
        for cid in set(prices) | set(self.prices):
            if prices.get(cid) != self.prices.get(cid):
                self.stale.add(cid)
        self.prices = prices

    def _nodes(self, session: Session, ids: Collection[str] | None) -> None:
        # Columns, not ORM objects: a full read is ~50,000 rows at 1,000 clusters.
        node_cols = select(
            Node.id,
            Node.cluster_id,
            Node.hostname,
            Node.status,
            Node.cordon,
            Node.measuring,
            Node.profile,
            Node.cpu_contention,
            Node.cpu_contention_busy,
            Node.fabric_bandwidth_gbps,
            Node.fabric_latency_ms,
            Node.cross_cluster_host,
            Node.sandbox,
            Node.devices_unavailable,
            Node.queue_wait_s,
        )
        acc_cols = select(
            Accelerator.id,
            Accelerator.node_id,
            Accelerator.index,
            Accelerator.model,
            Accelerator.kind,
            Accelerator.memory_gb,
            Accelerator.measured_tflops,
            Accelerator.link_group,
        )
        active = select(Allocation.accelerator_id).where(Allocation.active.is_(True))
        if ids is None:
            node_rows = list(session.execute(node_cols))
            acc_rows = list(session.execute(acc_cols))
            self.stale.update(self.cluster_nodes)
            self.nodes.clear()
            self.cluster_nodes.clear()
            self.devices.clear()
            self.device_node.clear()
            self.busy = set(session.scalars(active))
        else:
            node_rows = [
                r for chunk in _chunks(ids) for r in session.execute(node_cols.where(Node.id.in_(chunk)))
            ]
            acc_rows = [
                r
                for chunk in _chunks(ids)
                for r in session.execute(acc_cols.where(Accelerator.node_id.in_(chunk)))
            ]
            for nid in ids:
                self._drop_node(nid)
            for chunk in _chunks([r[0] for r in acc_rows]):
                self.busy.update(session.scalars(active.where(Allocation.accelerator_id.in_(chunk))))
        for (
            node_id,
            cluster_id,
            hostname,
            status,
            cordon,
            measuring,
            profile,
            contention,
            contention_busy,
            fabric_gbps,
            fabric_ms,
            cross,
            sandbox,
            unavailable,
            queue_wait,
        ) in node_rows:
            self.nodes[node_id] = _NodeRow(
                cluster_id,
                hostname,
                # placeable: an operator's cordon removes it, and so does a profile still to come
                # (the planner would price the node on defaults it was about to replace)
                status == "alive" and not cordon and not measuring,
                node_profile(profile),
                contention,
                fabric_gbps,
                fabric_ms,
                bool(cross),
                contention_busy,
                sandbox,
                unavailable or 0,
                queue_wait or 0.0,
            )
            self.cluster_nodes.setdefault(cluster_id, set()).add(node_id)
            self.stale.add(cluster_id)
        touched: set[str] = set()
        for acc_id, node_id, index, model, kind, memory_gb, tflops, link_group in acc_rows:
            if node_id not in self.nodes:
                continue
            self.devices.setdefault(node_id, []).append(
                _DeviceRow(acc_id, index, model, kind, memory_gb, tflops, link_group)
            )
            self.device_node[acc_id] = node_id
            touched.add(node_id)
        for node_id in touched:
            self.devices[node_id].sort(key=lambda d: d.index)

    def _drop_node(self, node_id: str) -> None:
        row = self.nodes.pop(node_id, None)
        if row is not None:
            self.cluster_nodes.get(row.cluster_id, set()).discard(node_id)
            self.stale.add(row.cluster_id)
        for d in self.devices.pop(node_id, []):
            self.device_node.pop(d.id, None)
            self.busy.discard(d.id)

    # -- building the snapshot ---------------------------------------------------------------------

    def snapshot(self, exclude_nodes: Collection[str] = ()) -> ResourceSnapshot:
        """Unchanged fleet, same object (its taken_at is when it was assembled): what the planner
        derives from a snapshot can then be reused across quotes."""
        if self.stale:
            self.rebuilt += len(self.stale)
            for cid in self.stale:
                self.built[cid] = self._build_cluster(cid)
            self.stale.clear()
            self.order = None
        if self.order is None:
            present = [c for c in self.built.values() if c is not None]
            self.order = sorted(present, key=lambda c: (c.region, c.name, c.id))
            self.whole = None
        if not exclude_nodes and self.whole is not None:
            return self.whole
        clusters = self.order
        if exclude_nodes:
            clusters = list(_without(clusters, set(exclude_nodes)))
        snap = ResourceSnapshot.model_construct(
            regions=[info for _, info in sorted(self.regions.items())],
            clusters=list(clusters),
            links=list(self.links),
            taken_at=time.time(),
        )
        if not exclude_nodes:
            self.whole = snap
        return snap

    def _build_cluster(self, cid: str) -> ClusterInfo | None:
        """Alive nodes without an operator's cordon or a profile still being measured, their
        measured devices (free iff no active allocation holds them), and a price in force; None
        without a price or such a node (nothing could be planned on it)."""
        row, price = self.clusters.get(cid), self.prices.get(cid)
        alive = sorted(n for n in self.cluster_nodes.get(cid, ()) if self.nodes[n].alive)
        if row is None or price is None or not alive:
            return None
        nodes = [
            NodeInfo(
                id=nid,
                hostname=self.nodes[nid].hostname,
                profile=self.nodes[nid].profile,
                cpu_contention=self.nodes[nid].cpu_contention,
                cpu_contention_busy=self.nodes[nid].cpu_contention_busy,
                fabric_bandwidth_gbps=self.nodes[nid].fabric_bandwidth_gbps,
                fabric_latency_ms=self.nodes[nid].fabric_latency_ms,
                cross_cluster_groups=self.nodes[nid].cross_cluster_groups,
                sandbox=self.nodes[nid].sandbox,  # type: ignore[arg-type]
                devices=self._device_slots(nid),
                queue_wait_s=self.nodes[nid].queue_wait_s,
            )
            for nid in alive
        ]
        return ClusterInfo(
            id=cid,
            name=row.name,
            provider=self.providers.get(row.provider_id, ""),
            region=row.region,
            nodes=nodes,
            intra_bandwidth_gbps=row.intra_bandwidth_gbps,
            intra_latency_ms=row.intra_latency_ms,
            price_per_device_hour=price[0],
            spot_price_per_device_hour=price[1],
        )

    def _device_slots(self, nid: str) -> list[DeviceSlot]:
        """A node's measured devices, free iff no active allocation holds them and they are not
        among the ``devices_unavailable`` its scheduler's other users hold (the highest free
        indices: which ones is the scheduler's choice, only their number matters)."""
        devices = [d for d in self.devices.get(nid, []) if d.memory_gb > 0 and d.tflops > 0]
        free = [d.id for d in devices if d.id not in self.busy]
        taken = self.nodes[nid].devices_unavailable
        usable = set(free[: max(0, len(free) - taken)])
        return [
            DeviceSlot(
                index=d.index,
                model=d.model,
                memory_gb=d.memory_gb,
                tflops=d.tflops,
                free=d.id in usable,
                kind=d.kind,  # type: ignore[arg-type]
                link_group=d.link_group,
            )
            for d in devices
        ]


def _without(clusters: Iterable[ClusterInfo], excluded: set[str]) -> Iterator[ClusterInfo]:
    for c in clusters:
        if not any(n.id in excluded for n in c.nodes):
            yield c
            continue
        kept = [n for n in c.nodes if n.id not in excluded]
        if kept:
            yield c.model_copy(update={"nodes": kept})


def _chunks(ids: Iterable[str]) -> Iterator[list[str]]:
    items = list(ids)
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]
