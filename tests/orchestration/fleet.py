"""Insert regions, clusters, nodes, accelerators, prices, links and tenants straight through the ORM."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.job_spec import JobSpec
from contracts.states import JobState
from control_layer.planner.plan_types import (
    CostBreakdown,
    Estimates,
    PlannedTask,
    PlanOption,
    StepBreakdown,
    SyncTopology,
)
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import (
    Accelerator,
    Allocation,
    Cluster,
    Job,
    Link,
    Node,
    Price,
    Provider,
    Region,
    Task,
    Tenant,
)


def ensure_region(session: Session, name: str, jurisdiction: str = "") -> Region:
    region = session.get(Region, name)
    if region is None:
        # A fixture's jurisdiction stands for one an admin set (agents' claims are not trusted).
        region = Region(name=name, jurisdiction=jurisdiction, jurisdiction_approved=bool(jurisdiction))
        session.add(region)
        session.flush()
    return region


def ensure_provider(session: Session, name: str) -> Provider:
    provider = session.scalars(select(Provider).where(Provider.name == name)).one_or_none()
    if provider is None:
        provider = Provider(name=name)
        session.add(provider)
        session.flush()
    return provider


def add_cluster(
    session: Session,
    *,
    region: str = "eu-west",
    name: str | None = None,
    jurisdiction: str = "",
    provider: str = "acme",
    price: float = 2.0,
    spot_price: float | None = None,
    nodes: int = 1,
    devices_per_node: int = 2,
    model: str = "cpu",
    memory_gb: float = 16.0,
    tflops: float = 1.0,
    sync_ports: tuple[int, int] = (20000, 20009),
    advertise_host: str = "127.0.0.1",
) -> tuple[Cluster, list[Node]]:
    ensure_region(session, region, jurisdiction)
    prov = ensure_provider(session, provider)
    cluster = Cluster(name=name or f"{region}-c", region=region, provider_id=prov.id)
    session.add(cluster)
    session.flush()
    session.add(
        Price(
            cluster_id=cluster.id,
            price_per_device_hour=price,
            spot_price_per_device_hour=spot_price,
            effective_from=utcnow() - timedelta(seconds=1),
        )
    )
    made: list[Node] = []
    for i in range(nodes):
        node = Node(
            cluster_id=cluster.id,
            hostname=f"{cluster.name}-n{i}",
            token_hash=f"hash-{cluster.name}-{i}",
            advertise_host=advertise_host,
            sync_port_min=sync_ports[0],
            sync_port_max=sync_ports[1],
            status="alive",
            last_heartbeat_at=utcnow(),
        )
        session.add(node)
        session.flush()
        for d in range(devices_per_node):
            session.add(
                Accelerator(
                    node_id=node.id,
                    index=d,
                    model=model,
                    kind="cpu",
                    memory_gb=memory_gb,
                    measured_tflops=tflops,
                )
            )
        made.append(node)
    session.flush()
    return cluster, made


def add_link(
    session: Session,
    src: str,
    dst: str,
    *,
    bandwidth_gbps: float = 1.0,
    latency_ms: float = 50.0,
    egress_price_per_gb: float = 0.05,
    private: bool = False,
) -> Link:
    link = Link(
        src=src,
        dst=dst,
        bandwidth_gbps=bandwidth_gbps,
        latency_ms=latency_ms,
        egress_price_per_gb=egress_price_per_gb,
        private=private,
    )
    session.add(link)
    session.flush()
    return link


def add_tenant(session: Session, name: str = "acme-research", is_admin: bool = False) -> Tenant:
    tenant = Tenant(name=name, is_admin=is_admin)
    session.add(tenant)
    session.flush()
    return tenant


def hold_devices(session: Session, tenant: Tenant, node: Node, indices: list[int]) -> Task:
    """A running job holding ``indices`` of ``node`` (rows written directly, bypassing placement)."""
    job = Job(tenant_id=tenant.id, name="holder", spec={}, status="running", attempt=1)
    session.add(job)
    session.flush()
    task = Task(
        job_id=job.id,
        attempt=1,
        cluster_id=node.cluster_id,
        node_id=node.id,
        region="",
        status="running",
        device_indices=indices,
        placement=[],
        worker_config={},
    )
    session.add(task)
    session.flush()
    accs = session.scalars(select(Accelerator).where(Accelerator.node_id == node.id)).all()
    for acc in accs:
        if acc.index in indices:
            session.add(Allocation(job_id=job.id, task_id=task.id, accelerator_id=acc.id))
    session.flush()
    return task


def tiny_spec(name: str = "tiny", **overrides: object) -> JobSpec:
    """A job small enough for CPU workers: 2 layers, 32 wide, 4 sequences of 16 tokens per step."""
    raw: dict[str, object] = {
        "name": name,
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab": 64, "seq_len": 16},
        "training": {"steps": 4, "global_batch_tokens": 64},
        "sync": {"mode": "diloco", "every": 2},
    }
    raw.update(overrides)
    return JobSpec.model_validate(raw)


def hand_option(
    placements: list[tuple[Cluster, Node, int]],
    *,
    option_id: str = "opt-1",
    tp: int = 1,
    cost: float = 1.0,
    duration_s: float = 60.0,
    label: str | None = "cheapest",
    spot: bool = False,
) -> PlanOption:
    """A plan option written by hand: one device per (cluster, node, device index), ``tp`` devices a
    replica, replicas numbered in the order given."""
    tasks = [
        PlannedTask(
            dp_rank=i // tp, pp_stage=0, tp_rank=i % tp, cluster=c.id, node=n.id, device=d, region=c.region
        )
        for i, (c, n, d) in enumerate(placements)
    ]
    dp = len(placements) // tp
    per_cluster: dict[str, int] = {}
    for t in tasks[::tp]:
        per_cluster[t.cluster] = per_cluster.get(t.cluster, 0) + 1
    return PlanOption(
        id=option_id,
        label=label,
        dp=dp,
        tp=tp,
        pp=1,
        zero=0,
        spot=spot,
        replicas_per_cluster=per_cluster,
        tasks=tasks,
        sync=SyncTopology(mode="diloco", ring=list(per_cluster), every=2),
        estimates=Estimates(
            step_s=StepBreakdown(compute=1.0),
            steps=4,
            duration_s=duration_s,
            cost=CostBreakdown(devices=cost),
            memory_per_device_gb=1.0,
            tokens_per_s=100.0,
            wan_bytes_per_step=0.0,
        ),
        regions=sorted({c.region for c, _, _ in placements}),
    )


def submit_and_place(ctx: ServerContext, tenant_id: str, **kwargs: Any) -> Job:
    """Submit (the job is stored queued and nothing more), then run the placer's step for it."""
    from control_layer.jobs import place_job, submit_job

    job = submit_job(ctx, tenant_id, **kwargs)
    assert job.status == JobState.QUEUED and job.attempt == 0
    place_job(ctx, job.id)
    with session_scope(ctx.session_factory) as s:
        placed = s.get(Job, job.id)
        assert placed is not None
        return placed
