"""Reserve a plan option's devices and create its tasks, all in the caller's ONE transaction.

Two jobs can never hold the same device: the rows are inserted under the partial unique index on
``allocations(accelerator_id) WHERE active``. Before inserting, the option's nodes and accelerators
are locked (``SELECT ... FOR UPDATE`` on PostgreSQL, in id order so allocators cannot deadlock;
SQLite transactions are ``BEGIN IMMEDIATE`` and so already serial) and re-checked against what
is allocated now. Anything stale raises ``AllocationConflict``: the caller re-plans on a fresh
snapshot.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contracts.errors import Aborted
from contracts.job_spec import JobSpec
from contracts.states import TASK_ACTIVE, TaskState
from control_layer.checkpoint_copies import reachable_checkpoints, sign_fetches
from control_layer.planner.node_groups import node_groups
from control_layer.planner.plan_types import PlannedTask, PlanOption
from control_layer.snapshot import current_prices
from control_layer.stage_sections import JobStage
from control_layer.worker_config import (
    TaskSlot,
    build_worker_configs,
    group_by_node,
    stage_port_counts,
    validate_worker_config,
)
from orchestration.db.base import utcnow
from orchestration.db.models import Accelerator, Allocation, Cluster, Job, Link, Node, Price, Task
from orchestration.resource_changes import NOTED, note_changes
from orchestration.settings import DEFAULT_PLATFORM_FEE
from orchestration.sync_tls import checkpoint_credentials, group_credentials, job_ca_pem, leader_credentials
from resource_layer.link_view import declared_private


class AllocationConflict(Aborted):
    """The option no longer fits the fleet (device taken, node gone, ports used): plan again."""

    code = "allocation_conflict"


def allocate(
    session: Session,
    job: Job,
    spec: JobSpec,
    option: PlanOption,
    attempt: int,
    *,
    sync_secret: str | None = None,
    platform_fee: float = DEFAULT_PLATFORM_FEE,
    stage: JobStage | None = None,
) -> list[Task]:
    """Lock, re-check and reserve; create one Task per node with its worker config (``stage``:
    the job's code, data and outputs sections). Flushes, so a unique-index violation surfaces
    here as AllocationConflict (the caller rolls back)."""
    groups = group_by_node(option)
    nodes = _lock_nodes(session, sorted(groups))
    for node_id, entries in groups.items():
        node = nodes[node_id]
        wanted = {e.cluster for e in entries}
        if wanted != {node.cluster_id}:
            raise AllocationConflict(f"node {node_id} is in cluster {node.cluster_id}, not {sorted(wanted)}")
    accelerators = _lock_accelerators(session, groups)
    busy = _busy(session, accelerators)
    if busy:
        taken = sorted(f"{a.node_id}:{a.index}" for a in accelerators.values() if a.id in busy)
        raise AllocationConflict(f"devices already allocated: {', '.join(taken)}")
    slots = _task_slots(session, spec, option, groups, nodes)
    configs = build_worker_configs(
        job.id,
        spec,
        option,
        slots,
        sync_secret=sync_secret,
        checkpoints=reachable_checkpoints(session, job.id),
        stage=stage,
    )
    _check_private_links(session, node_groups(option.tasks), slots)
    sign_fetches(session, job.id, configs)
    if sync_secret:
        add_job_credentials(configs, job.id, sync_secret)
    tasks = _new_tasks(session, job, option, attempt, slots, configs, platform_fee)
    _reserve(session, job.id, tasks, accelerators)
    return tasks


def _task_slots(
    session: Session,
    spec: JobSpec,
    option: PlanOption,
    groups: dict[str, list[PlannedTask]],
    nodes: dict[str, Node],
) -> list[TaskSlot]:
    """Each node's share of the option with the ports it listens on: a group's leader listens
    for the other groups' leaders (when there are any) and, when the group spans nodes, hosts its
    rendezvous; other nodes of a group need no port. With per-stage sync, every node holding
    stages' leaders listens once per such stage instead."""
    clusters = {
        c.id: c
        for c in session.scalars(
            select(Cluster).where(Cluster.id.in_({n.cluster_id for n in nodes.values()}))
        )
    }
    process_groups = node_groups(option.tasks)
    multi = len(process_groups) > 1
    spanning = {g[0] for g in process_groups if len(g) > 1}
    staged = stage_port_counts(option, spec.sync.mode)
    wanted_ports = {g[0]: int(multi) + int(g[0] in spanning) for g in process_groups}
    for node_id, k in staged.items():
        wanted_ports[node_id] = k + int(node_id in spanning)
    ports = _assign_sync_ports(session, [nodes[n] for n, k in wanted_ports.items() if k], wanted_ports)
    return [
        TaskSlot(
            node_id=node_id,
            cluster_id=nodes[node_id].cluster_id,
            cluster_name=clusters[nodes[node_id].cluster_id].name,
            region=clusters[nodes[node_id].cluster_id].region,
            host=nodes[node_id].advertise_host,
            sync_port=ports[node_id][0] if multi and node_id in ports else None,
            entries=tuple(entries),
            group_port=ports[node_id][-1] if node_id in spanning and node_id in ports else None,
            cross_cluster_host=nodes[node_id].cross_cluster_host,
            stage_ports=tuple(ports.get(node_id, [])[: staged.get(node_id, 0)]),
        )
        for node_id, entries in groups.items()
    ]


def _new_tasks(
    session: Session,
    job: Job,
    option: PlanOption,
    attempt: int,
    slots: list[TaskSlot],
    configs: dict[str, dict[str, Any]],
    platform_fee: float,
) -> list[Task]:
    """One pending Task per slot at the prices in force, added to the session."""
    prices = current_prices(session, sorted({s.cluster_id for s in slots}))
    egress = _egress_prices(session, {s.region for s in slots})
    tasks: list[Task] = []
    for slot in slots:
        task = Task(
            job_id=job.id,
            attempt=attempt,
            cluster_id=slot.cluster_id,
            node_id=slot.node_id,
            region=slot.region,
            status=TaskState.PENDING,
            device_indices=slot.device_indices,
            placement=[e.model_dump(mode="json") for e in slot.entries],
            worker_config=validate_worker_config(configs[slot.node_id]),
            sync_port=slot.sync_port,
            price_per_device_hour=_device_price(prices.get(slot.cluster_id), slot.cluster_id, option.spot),
            egress_price_per_gb=egress(slot.region),
            platform_fee=platform_fee,
        )
        session.add(task)
        tasks.append(task)
    return tasks


def _busy(session: Session, accelerators: dict[tuple[str, int], Accelerator]) -> set[str]:
    """Which of these accelerators an active allocation holds now."""
    return set(
        session.scalars(
            select(Allocation.accelerator_id).where(
                Allocation.active.is_(True),
                Allocation.accelerator_id.in_([a.id for a in accelerators.values()]),
            )
        )
    )


def _device_price(price: Price | None, cluster_id: str, spot: bool) -> float:
    """USD per device-hour of the price row in force: its spot price where the option runs on spot
    capacity and the cluster offers it."""
    if price is None:
        raise AllocationConflict(f"cluster {cluster_id} has no price in force")
    if spot and price.spot_price_per_device_hour is not None:
        return price.spot_price_per_device_hour
    return price.price_per_device_hour


def _reserve(
    session: Session, job_id: str, tasks: list[Task], accelerators: dict[tuple[str, int], Accelerator]
) -> None:
    """The tasks' allocation rows; a device another job took meanwhile breaks the unique index on
    active allocations, raised here as AllocationConflict."""
    session.flush()  # task ids, for the allocation rows
    for task in tasks:
        for index in task.device_indices:
            session.add(
                Allocation(
                    job_id=job_id, task_id=task.id, accelerator_id=accelerators[(task.node_id, index)].id
                )
            )
    try:
        session.flush()
    except IntegrityError as exc:
        raise AllocationConflict(f"a device was allocated concurrently: {exc.orig}") from exc


def add_job_credentials(configs: dict[str, dict[str, Any]], job_id: str, sync_secret: str) -> None:
    """Give each task's config (node id -> worker config) its TLS material, all of the job's own CA
    (``orchestration.sync_tls``): the sync leaders' (several groups), the checkpoint copies' (a
    task with a checkpoint directory or a fetch), and the rendezvous of a group spanning nodes
    (with a store secret shared by the group's nodes)."""
    ca = job_ca_pem(sync_secret, job_id)
    secrets_by_head: dict[tuple[str, int], str] = {}
    for node_id, config in configs.items():
        if "auth_secret" in (config.get("sync") or {}):  # its leaders meet over mutual TLS
            config["sync"] |= leader_credentials(sync_secret, job_id, config["region"], ca_pem=ca)
        ck = config.get("checkpoint") or {}
        if ck.get("dir") or ck.get("fetch"):  # its copies and fetches, over mutual TLS
            ck["tls"] = checkpoint_credentials(sync_secret, job_id, node_id, ca_pem=ca)
        group = config.get("group")
        if group:  # one secret per group: its head's address names it
            head = (group["master_addr"], group["master_port"])
            secret = secrets_by_head.setdefault(head, secrets.token_hex(32))
            group |= group_credentials(sync_secret, job_id, node_id, ca_pem=ca) | {"store_secret": secret}


def _check_private_links(session: Session, groups: list[list[str]], slots: list[TaskSlot]) -> None:
    """A group across clusters sends plaintext gloo/NCCL traffic between them: refuse the option
    where a link it crosses is no longer declared private (the plan may predate the change)."""
    where = {s.node_id: (s.cluster_id, s.region) for s in slots}
    crossing = [sorted({where[n] for n in g}) for g in groups if len(g) > 1]
    crossing = [cs for cs in crossing if len(cs) > 1]
    if not crossing:
        return
    declared = {(ln.src, ln.dst): ln.private for ln in session.scalars(select(Link))}
    public = sorted(
        {
            (min(ra, rb), max(ra, rb))
            for cs in crossing
            for i, (_, ra) in enumerate(cs)
            for _, rb in cs[i + 1 :]
            if not declared_private(declared, ra, rb)
        }
    )
    if public:
        raise AllocationConflict(f"a group across clusters would cross links not declared private: {public}")


def allocate_replacement(
    session: Session,
    job: Job,
    lost: Task,
    node_id: str,
    devices: tuple[int, ...],
    configure: Callable[[TaskSlot], dict[str, Any]],
) -> Task:
    """Reserve ``devices`` of ``node_id`` for a task that takes over ``lost``'s share (same replicas,
    stages and shards) in the job's current attempt; ``configure`` gives its worker config for the
    slot. Locks and re-checks as ``allocate`` does; AllocationConflict when it no longer fits."""
    old = sorted(lost.placement or [], key=lambda e: (e["dp_rank"], e["pp_stage"], e["tp_rank"]))
    if len(old) != len(devices):
        raise AllocationConflict(f"task {lost.id} ran {len(old)} devices, the replacement has {len(devices)}")
    nodes = _lock_nodes(session, [node_id])
    node = nodes[node_id]
    cluster = session.get(Cluster, node.cluster_id)
    assert cluster is not None
    entries = tuple(
        PlannedTask.model_validate(
            e | {"cluster": cluster.id, "node": node_id, "device": d, "region": cluster.region}
        )
        for e, d in zip(old, devices, strict=True)
    )
    accelerators = _lock_accelerators(session, {node_id: list(entries)})
    if _busy(session, accelerators):
        raise AllocationConflict(f"devices of node {node_id} were allocated meanwhile")
    port = (
        _assign_sync_ports(session, [node], {node_id: 1}).get(node_id, [None])[0]
        if lost.sync_port is not None
        else None
    )
    slot = TaskSlot(
        node_id=node_id,
        cluster_id=cluster.id,
        cluster_name=cluster.name,
        region=cluster.region,
        host=node.advertise_host,
        sync_port=port,
        entries=entries,
        cross_cluster_host=node.cross_cluster_host,
    )
    price = current_prices(session, [cluster.id]).get(cluster.id)
    unit = _device_price(price, cluster.id, bool((job.option or {}).get("spot")))
    task = Task(
        job_id=job.id,
        attempt=lost.attempt,
        cluster_id=cluster.id,
        node_id=node_id,
        region=cluster.region,
        status=TaskState.PENDING,
        device_indices=list(slot.device_indices),
        placement=[e.model_dump(mode="json") for e in entries],
        worker_config=validate_worker_config(configure(slot)),
        sync_port=port,
        price_per_device_hour=unit,
        egress_price_per_gb=lost.egress_price_per_gb,
        platform_fee=lost.platform_fee,
    )
    session.add(task)
    _reserve(session, job.id, [task], accelerators)
    return task


def release(session: Session, job_id: str, task_ids: list[str] | None = None) -> int:
    """Deactivate the job's active allocations (of ``task_ids`` only, if given); returns how many."""
    stmt = (
        update(Allocation)
        .where(Allocation.job_id == job_id, Allocation.active.is_(True))
        .values(active=False, released_at=utcnow())
        .returning(Allocation.accelerator_id)
        .execution_options(synchronize_session=False, **NOTED)
    )
    if task_ids is not None:
        stmt = stmt.where(Allocation.task_id.in_(task_ids))
    freed = session.scalars(stmt).all()
    note_changes(session, accelerators=freed)
    return len(freed)


def _lock_nodes(session: Session, node_ids: list[str]) -> dict[str, Node]:
    rows = session.scalars(
        select(Node).where(Node.id.in_(node_ids)).order_by(Node.id).with_for_update()
    ).all()
    nodes = {n.id: n for n in rows}
    for node_id in node_ids:
        node = nodes.get(node_id)
        if node is None:
            raise AllocationConflict(f"node {node_id} no longer exists")
        if node.status != "alive":
            raise AllocationConflict(f"node {node_id} is {node.status}")
        if node.cordon:  # cordoned after the plan was made: place nothing new on it
            raise AllocationConflict(f"node {node_id} is {node.cordon}")
    return nodes


def _lock_accelerators(
    session: Session, groups: dict[str, list[PlannedTask]]
) -> dict[tuple[str, int], Accelerator]:
    rows = session.scalars(
        select(Accelerator)
        .where(Accelerator.node_id.in_(list(groups)))
        .order_by(Accelerator.id)
        .with_for_update()
    ).all()
    by_key = {(a.node_id, a.index): a for a in rows}
    wanted: dict[tuple[str, int], Accelerator] = {}
    for node_id, entries in groups.items():
        for e in entries:
            acc = by_key.get((node_id, e.device))
            if acc is None:
                raise AllocationConflict(f"node {node_id} has no device {e.device} any more")
            if (node_id, e.device) in wanted:
                raise AllocationConflict(f"option places two ranks on device {e.device} of node {node_id}")
            wanted[(node_id, e.device)] = acc
    return wanted


def _assign_sync_ports(
    session: Session, nodes: Iterable[Node], counts: dict[str, int]
) -> dict[str, list[int]]:
    """``counts[node]`` ports of each node's declared range not held by another active task on it
    (its sync port, or the rendezvous port of a group it leads), going round the range from the last
    one handed out (a just-cancelled worker may still be releasing its port). The node rows are
    locked, so two placements on one node cannot pick the same port."""
    ports: dict[str, list[int]] = {}
    for node in nodes:
        low, high = node.sync_port_min, node.sync_port_max
        if low <= 0 or high < low:
            continue  # no range declared: worker_config refuses multi-node jobs on it, naming the node
        active = session.execute(
            select(Task.sync_port, Task.worker_config).where(
                Task.node_id == node.id, Task.status.in_(TASK_ACTIVE)
            )
        ).all()
        used = (
            {p for p, _ in active if p is not None}
            | {
                int(g["master_port"])
                for _, wc in active
                if (g := (wc or {}).get("group")) and g.get("node_rank") == 0
            }
            | {port for _, wc in active for port in _stage_listen_ports(wc)}
        )
        last = session.scalar(
            select(Task.sync_port)
            .where(Task.node_id == node.id, Task.sync_port.is_not(None))
            .order_by(Task.created_at.desc(), Task.id.desc())
            .limit(1)
        )
        start = last + 1 if last is not None and low <= last < high else low
        order = [*range(start, high + 1), *range(low, start)]
        free = [p for p in order if p not in used][: counts.get(node.id, 1)]
        if len(free) < counts.get(node.id, 1):
            raise AllocationConflict(f"node {node.id}: all sync ports {low}-{high} are in use")
        ports[node.id] = free
    return ports


def _stage_listen_ports(worker_config: dict[str, Any] | None) -> list[int]:
    """The ports a task's per-stage rings listen on (``sync.stages``, on the node that leads them)."""
    stages = ((worker_config or {}).get("sync") or {}).get("stages") or []
    return [int(r["listen"].rsplit(":", 1)[1]) for r in stages if r.get("listen")]


def _egress_prices(session: Session, regions: set[str]) -> Callable[[str], float]:
    """Per region of the job: mean egress price of its links to the job's other regions."""
    price: dict[tuple[str, str], float] = {}
    for link in session.scalars(select(Link).where(Link.src.in_(regions), Link.dst.in_(regions))):
        price[(link.src, link.dst)] = link.egress_price_per_gb
    for (src, dst), p in list(price.items()):
        price.setdefault((dst, src), p)  # a lone direction serves both ways, as in the snapshot
    per_region: dict[str, float] = defaultdict(float)
    for region in regions:
        others = [price.get((region, o), 0.0) for o in regions if o != region]
        per_region[region] = sum(others) / len(others) if others else 0.0
    return lambda region: per_region[region]
