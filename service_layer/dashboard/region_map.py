"""The data the region map draws: regions with their clusters, nodes and devices, the links in
force with their use, and optionally one job's share of it. ``fleet_map`` reads it; the rest is pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.states import JOB_ACTIVE
from orchestration.bus.base import Bus
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, TaskMetric
from orchestration.ledger import wan_bytes_by_region
from service_layer import queries
from service_layer.dashboard.link_use import Sample, Sender, link_use, task_rates
from service_layer.dashboard.sync_edges import Edge, SyncEdges, job_sync_edges
from service_layer.schemas.jobs import JobDetail
from service_layer.schemas.resources import ClusterRead, LinkRead, RegionRead

USE_WINDOW_S = 60.0  # a link's use is its senders' rate over this recent window


@dataclass(frozen=True)
class RegionBox:
    name: str
    jurisdiction: str = ""
    clusters: tuple[str, ...] = ()
    nodes_alive: int = 0
    nodes: int = 0
    devices_free: int = 0
    devices_used: int = 0
    devices_down: int = 0  # on nodes that are not alive (and not held)
    sent_bytes: float = 0.0  # every byte its tasks' leaders sent over the WAN, ever


@dataclass(frozen=True)
class LinkLine:
    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float
    source: str  # measured | declared
    use_bps: float = 0.0  # bytes/s now


@dataclass(frozen=True)
class JobOverlay:
    """One job on the map: its devices and clusters per region, and the links its sync uses."""

    name: str
    devices: Mapping[str, int] = field(default_factory=dict)
    clusters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sync: SyncEdges = SyncEdges("", "none", ())


@dataclass(frozen=True)
class FleetMap:
    regions: tuple[RegionBox, ...]
    links: tuple[LinkLine, ...]


def region_boxes(
    regions: Sequence[RegionRead], clusters: Sequence[ClusterRead], sent: Mapping[str, float]
) -> tuple[RegionBox, ...]:
    """Per region, from the API's cluster view: devices held (used), free on alive nodes, and
    idle on nodes that are not alive or not offered yet, their profile still measuring (down)."""
    names: dict[str, list[str]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])  # alive, nodes, free, used, down
    for c in clusters:
        names[c.region].append(c.name)
        n = counts[c.region]
        for node in c.nodes:
            n[0] += node.alive
            n[1] += 1
            offered = node.alive and node.status != "measuring"
            for d in node.devices:
                n[3 if d.allocated else 2 if offered else 4] += 1
    # An agent's claim no admin approved is marked: data residency does not trust it.
    known = {
        r.name: r.jurisdiction + ("" if r.jurisdiction_approved or not r.jurisdiction else "?")
        for r in regions
    }
    for c in clusters:
        known.setdefault(c.region, "")
    return tuple(
        RegionBox(
            name=name,
            jurisdiction=known[name],
            clusters=tuple(sorted(names.get(name, []))),
            nodes_alive=counts[name][0],
            nodes=counts[name][1],
            devices_free=counts[name][2],
            devices_used=counts[name][3],
            devices_down=counts[name][4],
            sent_bytes=float(sent.get(name, 0.0)),
        )
        for name in sorted(known)
    )


def link_lines(links: Sequence[LinkRead], use: Mapping[Edge, float]) -> tuple[LinkLine, ...]:
    return tuple(
        LinkLine(ln.src, ln.dst, ln.bandwidth_gbps, ln.latency_ms, ln.source, use.get((ln.src, ln.dst), 0.0))
        for ln in sorted(links, key=lambda ln: (ln.src, ln.dst))
        if ln.src != ln.dst  # a region's own network between its clusters: no line to draw
    )


def job_overlay(job: JobDetail) -> JobOverlay:
    devices: dict[str, int] = defaultdict(int)
    clusters: dict[str, set[str]] = defaultdict(set)
    for t in job.tasks:
        devices[t.region] += len(t.device_indices)
        clusters[t.region].add(t.cluster_name or t.cluster_id[:8])
    if not job.tasks:  # placed but not yet dispatched, or ended: the option still says where
        for t in (job.option or {}).get("tasks") or []:
            if isinstance(t, dict) and isinstance(t.get("region"), str):
                devices[t["region"]] += 1
    return JobOverlay(
        name=job.name,
        devices=dict(devices),
        clusters={r: tuple(sorted(c)) for r, c in clusters.items()},
        sync=job_sync_edges(job.option),
    )


def current_link_use(session: Session, now: datetime | None = None) -> dict[Edge, float]:
    """Bytes/s on each directed region pair, from the metrics active jobs' leaders reported in
    the last ``USE_WINDOW_S``."""
    now = now or utcnow()
    jobs = session.execute(
        select(Job.id, Job.option).where(Job.status.in_([s.value for s in JOB_ACTIVE]))
    ).all()
    if not jobs:
        return {}
    edges = {job_id: job_sync_edges(option).edges for job_id, option in jobs}
    rows = session.execute(
        select(
            TaskMetric.task_id,
            TaskMetric.job_id,
            TaskMetric.region,
            TaskMetric.created_at,
            TaskMetric.wan_bytes_sent,
        ).where(
            TaskMetric.job_id.in_(list(edges)),
            TaskMetric.created_at >= now - timedelta(seconds=USE_WINDOW_S),
        )
    ).all()
    epoch = now.timestamp()
    samples = [
        Sample(task, as_utc(at).timestamp() - epoch, float(sent or 0)) for task, _, _, at, sent in rows
    ]
    senders = list({task: Sender(task, job, region) for task, job, region, _, _ in rows}.values())
    return link_use(senders, task_rates(samples), edges)


def fleet_map(session: Session, bus: Bus, fresh_s: float) -> FleetMap:
    regions = region_boxes(
        queries.list_regions(session), queries.list_clusters(session, bus), wan_bytes_by_region(session)
    )
    return FleetMap(regions, link_lines(queries.list_links(session, fresh_s), current_link_use(session)))
