"""The planner's snapshot kept in memory: loaded once, then updated from the rows that changed.

``build_snapshot`` reads the whole fleet per call (over a second at 1,000 clusters). A running
control plane instead keeps a ``LiveSnapshot``: the resource change feed (``orchestration.
resource_changes``) tells it which nodes, accelerators (allocations), clusters (prices) and
topology rows any replica committed, and the next quote re-reads just those. Unchanged clusters
keep their ``ClusterInfo`` objects, so what the planner derives from a cluster can be reused.

Staleness is bounded and harmless: marks arrive after commit (at once in this process, over the
bus from other replicas), a re-subscription and a periodic full reload cover lost bus messages,
and allocation re-checks every device under row locks, so a stale snapshot costs a re-plan,
never a double booking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_layer.heap import settle_long_lived
from control_layer.planner import prepare
from control_layer.planner.snapshot import (
    ClusterInfo,
    DeviceSlot,
    LinkInfo,
    NodeInfo,
    NodeProfileInfo,
    RegionInfo,
    ResourceSnapshot,
)
from control_layer.snapshot import build_snapshot, link_info, node_profile, region_info
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Accelerator, Allocation, Cluster, Node, Price, Provider, Region
from orchestration.resource_changes import RESOURCE_CHANGES_CHANNEL, ResourceChanges
from resource_layer.link_probes import current_links

log = logging.getLogger(__name__)

FULL_RELOAD_S = 300.0  # a safety net: a lost subscription already triggers a full reload
SETTLE_MIN_CLUSTERS = 64  # a small fleet is cheap to walk: not worth a full collection per change
LINK_RECHECK_S = 10.0  # links are few; re-reading them this often bounds how late a stale probe drops
_CHUNK = 900  # ids per IN (...) list: far below SQLite's and PostgreSQL's parameter limits


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
    alive: bool  # and placeable: not cordoned
    profile: NodeProfileInfo | None
    cpu_contention: float | None
    fabric_bandwidth_gbps: float | None = None
    fabric_latency_ms: float | None = None
    cross_cluster_groups: bool = False
    cpu_contention_busy: float | None = None
    sandbox: str = "none"


@dataclass(frozen=True)
class _DeviceRow:
    id: str
    index: int
    model: str
    kind: str
    memory_gb: float
    tflops: float


@dataclass
class _State:
    """The fleet's rows as plain data, and the ClusterInfo built from them (rebuilt when dirty)."""

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
    link_fresh_s: float = 1800.0
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
            Node.profile,
            Node.cpu_contention,
            Node.cpu_contention_busy,
            Node.fabric_bandwidth_gbps,
            Node.fabric_latency_ms,
            Node.cross_cluster_host,
            Node.sandbox,
        )
        acc_cols = select(
            Accelerator.id,
            Accelerator.node_id,
            Accelerator.index,
            Accelerator.model,
            Accelerator.kind,
            Accelerator.memory_gb,
            Accelerator.measured_tflops,
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
            profile,
            contention,
            contention_busy,
            fabric_gbps,
            fabric_ms,
            cross,
            sandbox,
        ) in node_rows:
            self.nodes[node_id] = _NodeRow(
                cluster_id,
                hostname,
                status == "alive" and not cordon,  # placeable: an operator's cordon removes it
                node_profile(profile),
                contention,
                fabric_gbps,
                fabric_ms,
                bool(cross),
                contention_busy,
                sandbox,
            )
            self.cluster_nodes.setdefault(cluster_id, set()).add(node_id)
            self.stale.add(cluster_id)
        touched: set[str] = set()
        for acc_id, node_id, index, model, kind, memory_gb, tflops in acc_rows:
            if node_id not in self.nodes:
                continue
            self.devices.setdefault(node_id, []).append(
                _DeviceRow(acc_id, index, model, kind, memory_gb, tflops)
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

    def settle_if_grown(self) -> None:
        """Once most of the fleet is newly built (a full load, or a fleet that arrived through
        registrations): derive the pools quotes reuse, then settle the heap with them in it
        (``control_layer.heap``). Each quote's few changed clusters wait until they add up to
        half the fleet."""
        if self.rebuilt >= max(SETTLE_MIN_CLUSTERS, len(self.built) // 2):
            self.rebuilt = 0
            prepare(self.snapshot())
            settle_long_lived()

    def _build_cluster(self, cid: str) -> ClusterInfo | None:
        """As build_snapshot decides: alive nodes, measured devices, a price in force, or nothing."""
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
                devices=[
                    DeviceSlot(
                        index=d.index,
                        model=d.model,
                        memory_gb=d.memory_gb,
                        tflops=d.tflops,
                        free=d.id not in self.busy,
                        kind=d.kind,  # type: ignore[arg-type]
                    )
                    for d in self.devices.get(nid, [])
                    if d.memory_gb > 0 and d.tflops > 0
                ],
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


class LiveSnapshot:
    """The snapshot one control-plane process keeps; thread-safe (quotes run in worker threads)."""

    def __init__(self, ctx: ServerContext, *, full_reload_s: float = FULL_RELOAD_S) -> None:
        self._ctx = ctx
        self.full_reload_s = full_reload_s
        self._lock = threading.Lock()  # guards _dirty and _since_load
        self._refresh = threading.Lock()  # one refresher at a time; guards _state
        self._dirty = ResourceChanges(everything=True)
        self._since_load: ResourceChanges | None = None  # marks made while a full reload reads
        self._state: _State | None = None
        self.listening = threading.Event()  # set while run_live_snapshot hears the bus

    def mark(self, changes: ResourceChanges) -> None:
        with self._lock:
            self._dirty.merge(changes)
            if self._since_load is not None:
                self._since_load.merge(changes)

    def snapshot(self, exclude_nodes: Collection[str] = ()) -> ResourceSnapshot:
        """The fleet now: what was marked since the last call is re-read first."""
        with self._refresh:
            with self._lock:
                changes, self._dirty = self._dirty, ResourceChanges()
            state = self._state
            too_old = state is not None and time.monotonic() - state.loaded_at > 2 * self.full_reload_s
            with session_scope(self._ctx.session_factory) as session:
                if state is None or changes.everything or too_old:
                    state = _State(link_fresh_s=self._ctx.settings.effective_link_fresh_s)
                    state.load_all(session)
                    self._state = state
                elif changes or state.next_price_at is not None or state.links_due():
                    state.apply(session, changes)
            snap = state.snapshot(exclude_nodes)
            state.settle_if_grown()
            return snap

    def reload(self) -> None:
        """Read everything afresh without holding up quotes; re-apply what changed meanwhile."""
        with self._lock:
            self._since_load = ResourceChanges()
        try:
            state = _State(link_fresh_s=self._ctx.settings.effective_link_fresh_s)
            with session_scope(self._ctx.session_factory) as session:
                state.load_all(session)
        finally:
            with self._lock:
                meanwhile, self._since_load = self._since_load, None
        state.snapshot()  # assembled here, off the quote path
        with self._refresh:
            with self._lock:
                self._dirty = meanwhile or ResourceChanges()
            self._state = state
            state.settle_if_grown()


def attach_live_snapshot(ctx: ServerContext, *, full_reload_s: float = FULL_RELOAD_S) -> LiveSnapshot:
    """Give ``ctx`` an in-memory snapshot fed by its own commits (at once) and, while
    ``run_live_snapshot`` runs, by other replicas' commits over the bus."""
    live = LiveSnapshot(ctx, full_reload_s=full_reload_s)
    ctx.resource_changes.subscribe(live.mark)
    ctx.live_snapshot = live
    return live


def detach_live_snapshot(ctx: ServerContext) -> None:
    live = ctx.live_snapshot
    if isinstance(live, LiveSnapshot):
        ctx.resource_changes.unsubscribe(live.mark)
    ctx.live_snapshot = None


def current_snapshot(
    ctx: ServerContext, session: Session, *, exclude_nodes: Collection[str] = ()
) -> ResourceSnapshot:
    """The live snapshot where this process keeps one, else one read from ``session``."""
    live = ctx.live_snapshot
    if isinstance(live, LiveSnapshot):
        return live.snapshot(exclude_nodes)
    fresh_s = ctx.settings.effective_link_fresh_s
    return build_snapshot(session, exclude_nodes=exclude_nodes, link_fresh_s=fresh_s)


async def run_live_snapshot(ctx: ServerContext, stop: asyncio.Event, *, retry_s: float = 1.0) -> None:
    """Hear other replicas' changes, and reload in full every ``full_reload_s``, until ``stop``."""
    live = ctx.live_snapshot
    if not isinstance(live, LiveSnapshot):
        raise RuntimeError("run_live_snapshot needs attach_live_snapshot(ctx) first")
    own = ctx.resource_changes.origin

    async def listen() -> None:
        while not stop.is_set():
            try:
                async with ctx.bus.subscribe(RESOURCE_CHANGES_CHANNEL) as messages:
                    live.mark(ResourceChanges(everything=True))  # what was said before we listened
                    live.listening.set()
                    async for _channel, message in messages:
                        if message.get("origin") != own:  # our own commits marked us already
                            live.mark(ResourceChanges.from_message(message))
            except Exception:
                log.exception("resource-change subscription failed; retrying")
            finally:
                live.listening.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)

    listener = asyncio.create_task(listen(), name="live-snapshot-listen")
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), live.full_reload_s)
            if not stop.is_set():
                try:
                    await asyncio.to_thread(live.reload)
                except Exception:
                    log.exception("full reload of the live snapshot failed")
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener
