"""Read side of the API: turn rows into the response schemas (no writes, no domain decisions)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.states import JobState
from control_layer.checkpoints import job_checkpoints
from control_layer.snapshot import busy_accelerator_ids, current_prices
from control_layer.submissions import JobDraft
from orchestration.bus.base import Bus
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import (
    Accelerator,
    Cluster,
    Event,
    Job,
    LinkProbe,
    Node,
    Provider,
    Region,
    Task,
    TaskMetric,
)
from resource_layer.link_probes import current_links
from resource_layer.liveness import node_alive_key
from service_layer.floor import entropy_floor, uniform_loss
from service_layer.schemas.jobs import (
    EstimatesRead,
    EventRead,
    JobDetail,
    JobSummary,
    MetricPoint,
    MetricSeries,
    Progress,
    QueueInfo,
    SpreadPoint,
    TaskRead,
)
from service_layer.schemas.resources import (
    ClusterRead,
    DeviceRead,
    LinkProbeRead,
    LinkRead,
    NodeRead,
    NodeStagingRead,
    RegionRead,
)

_T = TypeVar("_T")

JobRow = Job | JobDraft  # a stored job, or one just submitted (not read back)

# ---------------------------------------------------------------- resources


def list_regions(session: Session) -> list[RegionRead]:
    clusters = dict(
        session.execute(select(Cluster.region, func.count(Cluster.id)).group_by(Cluster.region)).all()
    )
    alive = Node.status == "alive"
    placeable = _per_region(session, func.count(Node.id), alive, Node.measuring.is_(False))
    measuring = _per_region(session, func.count(Node.id), alive, Node.measuring.is_(True))
    devices = dict(
        session.execute(
            select(Cluster.region, func.count(Accelerator.id))
            .join(Node, Node.cluster_id == Cluster.id)
            .join(Accelerator, Accelerator.node_id == Node.id)
            .where(alive, Node.measuring.is_(False))
            .group_by(Cluster.region)
        ).all()
    )
    return [
        RegionRead(
            name=r.name,
            jurisdiction=r.jurisdiction,
            jurisdiction_approved=r.jurisdiction_approved,
            clusters=clusters.get(r.name, 0),
            alive_nodes=placeable.get(r.name, 0),
            measuring_nodes=measuring.get(r.name, 0),
            devices=devices.get(r.name, 0),
        )
        for r in session.scalars(select(Region).order_by(Region.name))
    ]


def _per_region(session: Session, what: Any, *where: Any) -> dict[str, int]:
    """``what`` over the nodes matching ``where``, per region."""
    rows = session.execute(
        select(Cluster.region, what)
        .join(Node, Node.cluster_id == Cluster.id)
        .where(*where)
        .group_by(Cluster.region)
    )
    return dict(rows.all())


def _staging_read(probe: dict[str, Any] | None) -> NodeStagingRead | None:
    """A node's stored staging figures as the API shows them (a row it cannot read: none)."""
    if not isinstance(probe, dict):
        return None
    try:
        return NodeStagingRead.model_validate(probe, strict=False)
    except ValidationError:
        return None


def list_clusters(session: Session, bus: Bus, now: datetime | None = None) -> list[ClusterRead]:
    now = now or utcnow()
    clusters = list(session.scalars(select(Cluster).order_by(Cluster.region, Cluster.name)))
    providers = {p.id: p.name for p in session.scalars(select(Provider))}
    prices = current_prices(session)
    busy = busy_accelerator_ids(session)
    nodes_by_cluster: dict[str, list[Node]] = defaultdict(list)
    for node in session.scalars(select(Node).order_by(Node.registered_at, Node.id)):
        nodes_by_cluster[node.cluster_id].append(node)
    devices_by_node: dict[str, list[Accelerator]] = defaultdict(list)
    for acc in session.scalars(select(Accelerator).order_by(Accelerator.node_id, Accelerator.index)):
        devices_by_node[acc.node_id].append(acc)

    def node_read(node: Node) -> NodeRead:
        last = as_utc(node.last_heartbeat_at) if node.last_heartbeat_at else None
        return NodeRead(
            id=node.id,
            hostname=node.hostname,
            # A live node whose profile has not arrived is not placed yet: "alive" means placeable.
            status="measuring" if node.status == "alive" and node.measuring else node.status,
            cordon=node.cordon,
            alive=node.status == "alive" and bus.alive(node_alive_key(node.id)),
            last_heartbeat_at=last,
            heartbeat_age_s=(now - last).total_seconds() if last else None,
            advertise_host=node.advertise_host,
            agent_version=node.agent_version,
            sandbox=node.sandbox,
            staging=_staging_read(node.staging_probe),
            cordon_reason=node.cordon_reason,
            device_samples=node.device_samples,
            devices=[
                DeviceRead.model_validate(a).model_copy(update={"allocated": a.id in busy})
                for a in devices_by_node.get(node.id, [])
            ],
        )

    out = []
    for c in clusters:
        price = prices.get(c.id)
        out.append(
            ClusterRead(
                id=c.id,
                name=c.name,
                region=c.region,
                provider=providers.get(c.provider_id, ""),
                intra_bandwidth_gbps=c.intra_bandwidth_gbps,
                price_per_device_hour=price.price_per_device_hour if price else None,
                spot_price_per_device_hour=price.spot_price_per_device_hour if price else None,
                nodes=[node_read(n) for n in nodes_by_cluster.get(c.id, [])],
            )
        )
    return out


def list_links(session: Session, fresh_s: float) -> list[LinkRead]:
    return [LinkRead.model_validate(ln, from_attributes=True) for ln in current_links(session, fresh_s)]


def list_link_probes(session: Session, limit: int) -> list[LinkProbeRead]:
    rows = session.scalars(select(LinkProbe).order_by(LinkProbe.requested_at.desc()).limit(limit))
    return [LinkProbeRead.model_validate(r) for r in rows]


# ---------------------------------------------------------------- jobs


def _current_tasks(session: Session, jobs: Sequence[Job]) -> dict[str, list[Task]]:
    """Tasks of each job's current attempt, less those it dropped (lost in an elastic job; the
    job's events name them)."""
    if not jobs:
        return {}
    attempts = {j.id: j.attempt for j in jobs}
    out: dict[str, list[Task]] = defaultdict(list)
    rows = session.scalars(select(Task).where(Task.job_id.in_(list(attempts))).order_by(Task.region, Task.id))
    for t in rows:
        if t.attempt == attempts[t.job_id] and not t.dropped:
            out[t.job_id].append(t)
    return out


def progress_of(job: JobRow, tasks: Sequence[Task]) -> Progress | None:
    reported = [t.last_metrics for t in tasks if t.last_metrics]
    total = int(((job.spec or {}).get("training") or {}).get("steps", 0))
    if not reported:
        return None
    losses = [m["loss"] for m in reported if isinstance(m.get("loss"), int | float)]
    return Progress(
        step=min(int(m.get("step", 0)) for m in reported),
        total_steps=int(reported[0].get("total_steps") or total),
        loss=sum(losses) / len(losses) if losses else None,
        tokens_per_s=sum(float(m.get("tokens_per_s") or 0.0) for m in reported),
        wan_bytes_sent=sum(int(m.get("wan_bytes_sent") or 0) for m in reported),
        wan_bytes_recv=sum(int(m.get("wan_bytes_recv") or 0) for m in reported),
        wan_wire_bytes_sent=(
            sum(int(m["wan_wire_bytes_sent"]) for m in reported)
            if all(isinstance(m.get("wan_wire_bytes_sent"), int | float) for m in reported)
            else None
        ),
    )


def _regions(job: JobRow, tasks: Sequence[Task]) -> list[str]:
    if tasks:
        return sorted({t.region for t in tasks})
    return list((job.option or {}).get("regions") or [])


def _summary_fields(job: JobRow, tasks: Sequence[Task]) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "tenant_id": job.tenant_id,
        "status": job.status,
        "reason": job.reason,
        "deferred": job.deferred,
        "choice": job.choice,
        "attempt": job.attempt,
        "created_at": as_utc(job.created_at),
        "started_at": as_utc(job.started_at) if job.started_at else None,
        "finished_at": as_utc(job.finished_at) if job.finished_at else None,
        "regions": _regions(job, tasks),
        "estimated_duration_s": job.estimated_duration_s,
        "estimated_cost": job.estimated_cost,
        "actual_cost": job.actual_cost,
        "progress": progress_of(job, tasks),
    }


def job_summaries(session: Session, jobs: Sequence[Job]) -> list[JobSummary]:
    tasks = _current_tasks(session, jobs)
    return [JobSummary(**_summary_fields(j, tasks.get(j.id, []))) for j in jobs]


def _estimates(job: JobRow) -> EstimatesRead | None:
    est = (job.option or {}).get("estimates")
    if not est and job.estimated_duration_s is None and job.estimated_cost is None:
        return None
    est = est or {}
    cost = est.get("cost") or {}
    return EstimatesRead(
        duration_s=est.get("duration_s", job.estimated_duration_s),
        cost_total=cost.get("total", job.estimated_cost),
        step_s={k: float(v) for k, v in (est.get("step_s") or {}).items()},
        cost={k: float(v) for k, v in cost.items()},
        tokens_per_s=est.get("tokens_per_s"),
        interval=est.get("interval"),
    )


def job_detail(session: Session, job: Job, now: datetime | None = None) -> JobDetail:
    tasks = _current_tasks(session, [job]).get(job.id, [])
    names = (
        dict(
            session.execute(
                select(Cluster.id, Cluster.name).where(Cluster.id.in_({t.cluster_id for t in tasks}))
            ).all()
        )
        if tasks
        else {}  # a queued job: no query
    )
    return _job_detail(job, tasks, names, job_checkpoints(session, job.id), now)


def submitted_job_detail(job: JobRow) -> JobDetail:
    """The answer to a submission: the row just stored has no tasks or checkpoints yet, so nothing
    is read back."""
    return _job_detail(job, [], {}, {}, None)


def _job_detail(
    job: JobRow,
    tasks: Sequence[Task],
    names: dict[str, str],
    checkpoints: dict[str, dict[str, Any]],
    now: datetime | None,
) -> JobDetail:
    actual_s = None
    if job.started_at is not None:
        end = as_utc(job.finished_at) if job.finished_at else (now or utcnow())
        actual_s = (end - as_utc(job.started_at)).total_seconds()
    return JobDetail(
        **_summary_fields(job, tasks),
        queue=QueueInfo(position=job.queue_position, reason=job.deferred)
        if job.status == JobState.QUEUED
        else None,
        quote_id=job.quote_id,
        spec=job.spec,
        option=job.option,
        tasks=[
            TaskRead(
                id=t.id,
                attempt=t.attempt,
                region=t.region,
                cluster_id=t.cluster_id,
                cluster_name=names.get(t.cluster_id, ""),
                node_id=t.node_id,
                device_indices=[int(d) for d in t.device_indices],
                status=t.status,
                exit_code=t.exit_code,
                message=t.message,
                placement=list(t.placement or []),
                last_metrics=t.last_metrics,
                checkpoint_step=t.checkpoint_step,
            )
            for t in tasks
        ],
        checkpoints=checkpoints,
        estimates=_estimates(job),
        actual_duration_s=actual_s,
        result=job.result,
        entropy_floor=entropy_floor(job.result, *(t.result for t in tasks), *(t.last_metrics for t in tasks)),
        accuracy=job.accuracy,
        preemption=job.preemption or None,
        preemptions=job.preemptions or 0,
    )


def metric_series(session: Session, job: Job, max_points: int = 500) -> MetricSeries:
    """The loss curve per region (every task's leader reports one, with gossip's spread where the
    job gossips), thinned to ``max_points`` each."""
    by_region: dict[str, list[MetricPoint]] = defaultdict(list)
    rows = session.execute(
        select(
            TaskMetric.region,
            TaskMetric.step,
            TaskMetric.loss,
            TaskMetric.tokens_per_s,
            TaskMetric.task_id,
            TaskMetric.gossip_spread,
        )
        .where(TaskMetric.job_id == job.id)
        .order_by(TaskMetric.region, TaskMetric.step, TaskMetric.id)
    )
    spread: dict[str, list[SpreadPoint]] = defaultdict(list)
    for region, step, loss, tps, task_id, gossip_spread in rows:
        by_region[region].append(MetricPoint(step=step, loss=loss, tokens_per_s=tps, task_id=task_id))
        if gossip_spread is not None:  # a check's step: sparse, so thinned on its own
            spread[region].append(SpreadPoint(step=step, spread=gossip_spread))
    tasks = _current_tasks(session, [job]).get(job.id, [])
    return MetricSeries(
        job_id=job.id,
        entropy_floor=entropy_floor(job.result, *(t.result for t in tasks), *(t.last_metrics for t in tasks)),
        uniform_loss=uniform_loss(job.spec),
        series={r: thin(points, max_points) for r, points in by_region.items()},
        spread={r: thin(points, max_points) for r, points in spread.items()},
    )


def thin(points: list[_T], max_points: int) -> list[_T]:
    """Keep at most ``max_points`` evenly spaced points, always including the last."""
    if max_points <= 0 or len(points) <= max_points:
        return points
    stride = len(points) / max_points
    kept = [points[int(i * stride)] for i in range(max_points - 1)]
    return [*kept, points[-1]]


def job_events(session: Session, job_id: str, after: int = 0, limit: int = 1000) -> list[EventRead]:
    rows = session.scalars(
        select(Event).where(Event.job_id == job_id, Event.id > after).order_by(Event.id).limit(limit)
    )
    return [
        EventRead(id=e.id, kind=e.kind, job_id=e.job_id, payload=e.payload, created_at=as_utc(e.created_at))
        for e in rows
    ]
