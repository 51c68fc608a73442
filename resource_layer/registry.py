"""Nodes joining, re-joining and staying alive: the resource layer's write side.

Functions take a session (the caller owns the transaction) or a ``ServerContext`` where they
also need the bus. All are synchronous; the gRPC edge runs them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session

from contracts.device_samples import GpuReport
from contracts.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from contracts.link_probe import new_probe_key
from contracts.registration import (
    MAX_CONTENTION,
    MAX_QUEUE_WAIT_S,
    MIN_CONTENTION,
    DeviceReport,
    NodeRegistration,
    ProfileReport,
    device_problems,
    validate_registration,
)
from orchestration.audit import record_audit
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import Accelerator, Allocation, Cluster, Node, Price, Provider, Region
from orchestration.resource_changes import NOTED, note_changes
from resource_layer.liveness import node_alive_key
from resource_layer.node_admin import CORDONED, OPEN, REVOKED
from resource_layer.tokens import consume_enrollment_token, new_node_token, token_matches

log = logging.getLogger(__name__)

DEFAULT_PROVIDER = "independent"


def register_node(
    session: Session, reg: NodeRegistration, now: datetime | None = None, source: str = ""
) -> tuple[Node, str]:
    """Validate, authenticate and upsert everything a registration declares; return the node and
    its plaintext token (new on every registration: the previous one stops working).

    First registration authenticates with an enrollment token (one use is counted). A node that
    already holds credentials re-registers with them instead and keeps its id.
    """
    validate_registration(reg)  # before any read or write: a malformed request changes nothing
    now = now or utcnow()
    if reg.node_id:
        node = authenticate_node(session, reg.node_id, reg.node_token)
        provider, enrolled_with = _provider_of(session, node), None
    else:
        token = consume_enrollment_token(session, reg.enrollment_token, now)
        provider, enrolled_with = token.provider, token.id
        node = None
    # The credential, not the request, says whose node this is: a declared name must agree.
    if reg.provider and reg.provider != provider:
        raise PermissionDenied(
            f"provider: these credentials enroll nodes of provider {provider!r}, not {reg.provider!r}",
            field="provider",
        )

    region, claimed = _upsert_region(session, reg.region, reg.jurisdiction)
    cluster = _upsert_cluster(session, region.name, reg.cluster, provider, reg.intra_bandwidth_gbps)
    if node is not None and node.cluster_id != cluster.id:
        raise FailedPrecondition(
            f"node {node.id} belongs to another cluster; register as a new node to move it"
            f" to {reg.region}/{reg.cluster}",
            node_id=node.id,
        )
    plaintext, digest = new_node_token()
    if node is None:
        node = Node(cluster_id=cluster.id, registered_at=now, enrollment_token_id=enrolled_with)
        session.add(node)
    node.token_hash = digest
    node.hostname = reg.hostname
    node.advertise_host = reg.advertise_host
    node.sync_port_min = reg.sync_port_min
    node.sync_port_max = reg.sync_port_max
    node.probe_port = reg.probe_port
    node.checkpoint_port = reg.checkpoint_port
    node.probe_key = new_probe_key()  # rotated with the node token: the old agent process is gone
    node.agent_version = reg.agent_version
    node.profile = reg.profile.as_dict() if reg.profile is not None else None
    # Registered before its measurement: not placed until the profile follows (record_profile).
    node.measuring = reg.profile_follows and reg.profile is None
    # Declared with every registration: a node that stops declaring goes back to the cluster's.
    node.fabric_bandwidth_gbps = reg.node_fabric_gbps or None
    node.fabric_latency_ms = reg.node_fabric_latency_ms or None
    node.cross_cluster_host = reg.cross_cluster_host or None
    node.sandbox = reg.sandbox
    if reg.cpu_contention:  # measured after the agent's own start-up: quotes use it at once
        node.cpu_contention = reg.cpu_contention
        node.cpu_contention_busy = None
    if node.status == "lost":
        node.status = "alive"
    session.flush()
    if claimed:  # in the audit log, where an admin reviews what awaits approval
        record_audit(
            session,
            actor_kind="node",
            actor_id=node.id,
            action="region.jurisdiction_claimed",
            target=f"region {region.name}",
            source=source,
            details={"jurisdiction": region.jurisdiction, "approved": False},
        )
    if reg.cpu_contention and reg.cpu_contention_probe_ages_s:
        probed = [now - timedelta(seconds=a) for a in reg.cpu_contention_probe_ages_s]
        node.cpu_contention_busy = busy_at_probes(session, {node.id: probed}).get(node.id)
    _record_price(
        session,
        cluster,
        node.id,
        reg.price_per_device_hour,
        reg.spot_price_per_device_hour or None,
        now,
        source,
    )
    _upsert_accelerators(session, node.id, reg.devices)
    return node, plaintext


def _provider_of(session: Session, node: Node) -> str:
    name = session.scalar(
        select(Provider.name)
        .join(Cluster, Cluster.provider_id == Provider.id)
        .where(Cluster.id == node.cluster_id)
    )
    return name or DEFAULT_PROVIDER


def authenticate_node(session: Session, node_id: str, node_token: str) -> Node:
    """The node these credentials belong to. Unknown id, wrong token and a revoked node read the same."""
    node = session.get(Node, node_id) if node_id else None
    revoked = node is not None and node.status == "revoked"
    if node is None or revoked or not node_token or not token_matches(node_token, node.token_hash):
        raise Unauthenticated("node credentials are invalid")
    return node


def mark_connected(ctx: ServerContext, node_id: str) -> str:
    """A node opened its stream: it is alive now, whatever the reaper last concluded. Returns
    ``drained`` when its agent must be told to drain (an operator's drain outlasts the agent's
    restarts), else the node's status.

    A node revoked since its credentials were checked is refused here: the stream subscribes to
    the node's channel before this runs, so a revocation is either read now or delivered there."""
    with ctx.session_factory() as session, session.begin():
        _touch_row(session, node_id, utcnow())
        row = session.execute(select(Node.status, Node.cordon).where(Node.id == node_id)).one_or_none()
    if row is None:
        raise NotFound(f"node {node_id} not found", node_id=node_id)
    if row.status == REVOKED:
        raise PermissionDenied(f"node {node_id} is revoked", node_id=node_id)
    ctx.bus.touch(node_alive_key(node_id), ctx.settings.node_lost_after_s)
    return "drained" if row.cordon == "draining" else row.status


CONTENTION_NOTICE = 0.1  # a relative change smaller than this is noise: neither stored nor announced
# A change in the host's other slots counted busy at the figure's probes (a mean over instants)
# smaller than this is noise too: half a slot moves a 2-core host's share by a quarter.
BUSY_NOTICE = 0.5


def heartbeat(
    ctx: ServerContext, node_id: str, persist: bool = True, contention: float | None = None
) -> None:
    """Refresh the node's liveness key; with ``persist`` also record ``last_heartbeat_at`` and the
    host's CPU contention (the planner prices CPU slots by what the host has left of a core).

    The key is the source of truth for liveness; the column is for people and snapshots, so the
    caller throttles ``persist`` to keep the database out of every heartbeat.
    """
    ctx.bus.touch(node_alive_key(node_id), ctx.settings.node_lost_after_s)
    if persist:
        persist_heartbeat(ctx, node_id, contention)


def persist_heartbeat(
    ctx: ServerContext,
    node_id: str,
    contention: float | None = None,
    probed_at: Sequence[datetime] = (),
) -> None:
    """Record ``last_heartbeat_at`` and the host's contention for one node."""
    persist_heartbeats(ctx, {node_id: contention}, {node_id: tuple(probed_at)} if probed_at else None)


def persist_heartbeats(
    ctx: ServerContext,
    heard: Mapping[str, float | None],
    probed_at: Mapping[str, Sequence[datetime]] | None = None,
    gpus: Mapping[str, GpuReport] | None = None,
) -> None:
    """Record ``last_heartbeat_at`` (and contention, where measured) for every node heard, in one
    transaction of a few statements however many nodes there are (the gRPC edge batches them; the
    liveness keys are refreshed separately). ``probed_at``: per node, when the probes its figure
    kept were taken (server time); with them the figure is stored with the host's other CPU
    slots busy then (``busy_at_probes``). ``gpus``: GPU nodes' device samples and health
    (``store_gpu_reports``)."""
    if not heard:
        return
    with ctx.session_factory() as session, session.begin():
        now = utcnow()
        _touch_rows(session, heard, now, probed_at or {})
        if gpus:
            store_gpu_reports(session, gpus, now)


def store_gpu_reports(session: Session, gpus: Mapping[str, GpuReport], now: datetime) -> list[str]:
    """Store each node's device samples; cordon, with the reason, an open node whose agent's GPU
    health rules found a fault (a fallen GPU, uncorrectable ECC errors). What runs there keeps
    running; an operator's uncordon opens it again, until the next report of the fault. Returns
    the nodes cordoned now."""
    cordoned = []
    for node_id in sorted(gpus):  # one lock order for every writer of these rows
        report = gpus[node_id]
        session.execute(
            update(Node)
            .where(Node.id == node_id)
            .values(device_samples=report.as_dict(now))
            .execution_options(synchronize_session=False, **NOTED)
        )
        if not (reason := report.cordon_reason):
            continue
        hit = session.scalars(
            update(Node)
            .where(Node.id == node_id, Node.cordon == OPEN, Node.status != REVOKED)
            .values(cordon=CORDONED, cordon_reason=reason)
            .returning(Node.id)
            .execution_options(synchronize_session=False, **NOTED)
        ).all()
        if hit:
            log.warning("node %s cordoned by its GPU health: %s", node_id, reason)
            cordoned += hit
    note_changes(session, nodes=cordoned)
    return cordoned


def busy_at_probes(session: Session, probed_at: Mapping[str, Sequence[datetime]]) -> dict[str, float]:
    """Per node, the CPU slots of the other nodes of its host (same hostname) that allocations
    held, averaged over the instants given for it. The node's own slots are left out: its agent
    probes only while none of its own workers run. A node without a hostname shares no host."""
    wanted = {n: ts for n, ts in probed_at.items() if ts}
    if not wanted:
        return {}
    host_of: dict[str, str] = {}
    for chunk in _chunks(sorted(wanted)):
        host_of.update(
            tuple(r) for r in session.execute(select(Node.id, Node.hostname).where(Node.id.in_(chunk)))
        )
    out = {n: 0.0 for n in wanted if n in host_of}
    hosts = sorted({h for h in host_of.values() if h})
    on_host: dict[str, list[str]] = {}
    for chunk in _chunks(hosts):
        for nid, host in session.execute(select(Node.id, Node.hostname).where(Node.hostname.in_(chunk))):
            on_host.setdefault(host, []).append(nid)
    others = sorted({o for n in out if host_of[n] for o in on_host.get(host_of[n], []) if o != n})
    if not others:
        return out
    instants = [as_utc(t) for n in out for t in wanted[n]]
    first, last = min(instants), max(instants)
    held: dict[str, list[tuple[datetime, datetime | None]]] = {}
    for chunk in _chunks(others):
        rows = session.execute(
            select(Accelerator.node_id, Allocation.created_at, Allocation.released_at, Allocation.active)
            .join(Allocation, Allocation.accelerator_id == Accelerator.id)
            .where(
                Accelerator.node_id.in_(chunk),
                Accelerator.kind == "cpu",
                Allocation.created_at <= last,
                or_(Allocation.active.is_(True), Allocation.released_at >= first),
            )
        )
        for nid, created, released, active in rows:
            end = None if active else (as_utc(released) if released is not None else as_utc(created))
            held.setdefault(nid, []).append((as_utc(created), end))
    for n in out:
        spans = [span for o in on_host.get(host_of[n], []) if o != n for span in held.get(o, [])]
        if spans:
            ts = [as_utc(t) for t in wanted[n]]
            out[n] = sum(sum(c <= t and (e is None or t < e) for c, e in spans) for t in ts) / len(ts)
    return out


def _store_contention(
    session: Session, figures: Mapping[str, float], busy: Mapping[str, float] | None
) -> list[str]:
    """Store the figures that moved (by more than CONTENTION_NOTICE, or their busy count by
    BUSY_NOTICE where one is given); the ids stored."""
    if not figures:
        return []
    figure = case(dict(figures), value=Node.id)
    moved = [
        Node.cpu_contention.is_(None),
        func.abs(Node.cpu_contention - figure) > CONTENTION_NOTICE * figure,
    ]
    values: dict = {"cpu_contention": figure, "cpu_contention_busy": None}
    if busy is not None:
        held = case(dict(busy), value=Node.id)
        moved += [
            Node.cpu_contention_busy.is_(None),
            func.abs(Node.cpu_contention_busy - held) >= BUSY_NOTICE,
        ]
        values["cpu_contention_busy"] = held
    return list(
        session.scalars(
            update(Node)
            .where(Node.id.in_(list(figures)), or_(*moved))
            .values(**values)
            .returning(Node.id)
            .execution_options(synchronize_session=False, **NOTED)
        ).all()
    )


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i : i + ROWS_PER_STATEMENT] for i in range(0, len(ids), ROWS_PER_STATEMENT)]


def record_profile(
    session: Session, node_id: str, report: ProfileReport, now: datetime | None = None
) -> Node:
    """The profile a node registered without: kept, and the node is placeable from now on. No
    profile (its measurement failed, ``report.error`` says why): it is placed on its declared
    figures, as a node that measures none. The contention settled after the measurement is
    stored as a registration's is. A repeat (the agent sends it on each new stream) changes
    nothing more."""
    problems = report.problems()
    if problems:
        raise InvalidArgument("invalid profile report: " + "; ".join(problems), problems=problems)
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found", field="node_id")
    if report.profile is not None:
        node.profile = report.profile.as_dict()
    elif report.error:
        log.warning("node %s measured no profile: %s", node_id, report.error)
    node.measuring = False
    if report.cpu_contention:
        now = now or utcnow()
        probed = [now - timedelta(seconds=a) for a in report.cpu_contention_probe_ages_s]
        node.cpu_contention = report.cpu_contention
        node.cpu_contention_busy = busy_at_probes(session, {node.id: probed}).get(node.id) if probed else None
    return node


def update_inventory(session: Session, node_id: str, devices: Sequence[DeviceReport]) -> None:
    """Replace a node's device list with what it reports now (re-measured after a restart)."""
    problems = device_problems(list(devices), where="inventory.devices")
    if problems:
        raise InvalidArgument("invalid inventory: " + "; ".join(problems), problems=problems)
    _upsert_accelerators(session, node_id, tuple(devices))


MAX_DEVICES_UNAVAILABLE = 1_000_000


def update_capacity(
    session: Session, node_id: str, devices_unavailable: int, queue_wait_s: float = 0.0
) -> None:
    """Record how many of a scheduler-backed node's devices are not cpn's to use now and the
    queue wait its agent expects (the row's change reaches the planner's snapshot through the
    change feed). Either out of bounds is refused, changing nothing."""
    if not 0 <= devices_unavailable <= MAX_DEVICES_UNAVAILABLE:
        raise InvalidArgument(
            f"capacity.devices_unavailable: {devices_unavailable} is outside [0, {MAX_DEVICES_UNAVAILABLE}]",
            field="capacity.devices_unavailable",
        )
    if not (math.isfinite(queue_wait_s) and 0 <= queue_wait_s <= MAX_QUEUE_WAIT_S):
        raise InvalidArgument(
            f"capacity.queue_wait_s: {queue_wait_s} is not a number of seconds in [0, {MAX_QUEUE_WAIT_S:g}]",
            field="capacity.queue_wait_s",
        )
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found", node_id=node_id)
    if node.devices_unavailable != devices_unavailable:
        node.devices_unavailable = devices_unavailable
    if node.queue_wait_s != queue_wait_s:
        node.queue_wait_s = queue_wait_s


def _touch_row(session: Session, node_id: str, now: datetime, contention: float | None = None) -> None:
    _touch_rows(session, {node_id: contention}, now, {})


ROWS_PER_STATEMENT = 1000  # keeps each IN list well inside every driver's parameter limit


def _touch_rows(
    session: Session,
    heard: Mapping[str, float | None],
    now: datetime,
    probed_at: Mapping[str, Sequence[datetime]],
) -> None:
    # A lost node that speaks again is alive; a drained one stays drained. Only a revival or a
    # contention change the planner would notice alters what it sees, so only those are announced
    # (heartbeats are frequent).
    ids = sorted(heard)  # one lock order for every writer of these rows
    for i in range(0, len(ids), ROWS_PER_STATEMENT):
        chunk = ids[i : i + ROWS_PER_STATEMENT]
        revived = session.scalars(
            update(Node)
            .where(Node.id.in_(chunk), Node.status == "lost")
            .values(status="alive")
            .returning(Node.id)
            .execution_options(synchronize_session=False, **NOTED)
        ).all()
        note_changes(session, nodes=revived)
        session.execute(
            update(Node)
            .where(Node.id.in_(chunk))
            .values(last_heartbeat_at=now)
            .execution_options(synchronize_session=False, **NOTED)
        )
        # a figure outside [MIN_CONTENTION, MAX_CONTENTION] (or 0: not measured) is not a
        # measurement: kept out
        measured = {
            n: c
            for n in chunk
            if (c := heard[n]) is not None and math.isfinite(c) and MIN_CONTENTION <= c <= MAX_CONTENTION
        }
        if not measured:
            continue
        busy = busy_at_probes(session, {n: probed_at[n] for n in measured if probed_at.get(n)})
        # Stored with the slots busy at its probes where their instants came (the planner reads
        # the figure less them); without, where none did (an older agent, or probes older than it
        # sends): the planner then reads the figure as the host.
        moved = _store_contention(session, {n: c for n, c in measured.items() if n in busy}, busy)
        moved += _store_contention(session, {n: c for n, c in measured.items() if n not in busy}, None)
        note_changes(session, nodes=moved)


def _upsert_region(session: Session, name: str, jurisdiction: str) -> tuple[Region, bool]:
    """The region, created on its first registration. An agent's jurisdiction is only a claim:
    the first one is recorded unapproved (data residency does not trust it until an admin sets
    the region's jurisdiction), and one that contradicts the region's recorded jurisdiction,
    approved or claimed, is refused; claiming none is always accepted. Also whether this
    registration recorded a new claim."""
    region = session.get(Region, name)
    if region is None:
        region = Region(name=name, jurisdiction=jurisdiction, jurisdiction_approved=False)
        session.add(region)
        return region, bool(jurisdiction)
    if jurisdiction and region.jurisdiction and jurisdiction != region.jurisdiction:
        how = (
            "set by an admin"
            if region.jurisdiction_approved
            else "claimed by its first agent, not yet approved"
        )
        raise FailedPrecondition(
            f"jurisdiction: region {name!r} is in jurisdiction {region.jurisdiction!r} ({how}); this agent"
            f" claims {jurisdiction!r}. Only an admin changes a region's jurisdiction"
            f" (PUT /v1/regions/{name}/jurisdiction)",
            field="jurisdiction",
            region=name,
            jurisdiction=region.jurisdiction,
            claimed=jurisdiction,
        )
    if jurisdiction and not region.jurisdiction:
        region.jurisdiction, region.jurisdiction_approved = jurisdiction, False
        return region, True
    return region, False


def _upsert_cluster(
    session: Session, region: str, name: str, provider: str, intra_bandwidth_gbps: float
) -> Cluster:
    cluster = session.scalar(select(Cluster).where(Cluster.region == region, Cluster.name == name))
    if cluster is None:
        provider_row = _upsert_provider(session, provider)
        cluster = Cluster(region=region, name=name, provider_id=provider_row.id)
        session.add(cluster)
    else:
        owner = session.get(Provider, cluster.provider_id)
        if owner is None or owner.name != provider:
            raise PermissionDenied(
                f"cluster: {region}/{name} belongs to provider {owner.name if owner else '?'!r};"
                f" a node of provider {provider!r} cannot join it",
                cluster_id=cluster.id,
            )
    if intra_bandwidth_gbps > 0:
        cluster.intra_bandwidth_gbps = intra_bandwidth_gbps
    session.flush()
    return cluster


def _upsert_provider(session: Session, name: str) -> Provider:
    provider = session.scalar(select(Provider).where(Provider.name == name))
    if provider is None:
        provider = Provider(name=name)
        session.add(provider)
        session.flush()
    return provider


def _record_price(
    session: Session,
    cluster: Cluster,
    node_id: str,
    price: float,
    spot: float | None,
    now: datetime,
    source: str,
) -> None:
    """Append a price row only when the price in force changes (the table is the price history),
    naming the node that set it, and audit the change."""
    current = session.scalar(
        select(Price)
        .where(Price.cluster_id == cluster.id)
        .order_by(Price.effective_from.desc(), Price.id)
        .limit(1)
    )
    before = None if current is None else (current.price_per_device_hour, current.spot_price_per_device_hour)
    if before == (price, spot):
        return
    session.add(
        Price(
            cluster_id=cluster.id,
            price_per_device_hour=price,
            spot_price_per_device_hour=spot,
            effective_from=now,
            set_by_node_id=node_id,
        )
    )
    record_audit(
        session,
        actor_kind="node",
        actor_id=node_id,
        action="price.changed" if before else "price.set",
        target=f"cluster {cluster.region}/{cluster.name}",
        source=source,
        details={
            "cluster_id": cluster.id,
            "price_per_device_hour": price,
            "spot_price_per_device_hour": spot,
            "previous": None if before is None else {"price_per_device_hour": before[0], "spot": before[1]},
        },
    )


def _upsert_accelerators(session: Session, node_id: str, devices: tuple[DeviceReport, ...]) -> None:
    existing = {
        a.index: a for a in session.scalars(select(Accelerator).where(Accelerator.node_id == node_id))
    }
    for d in devices:
        row = existing.pop(d.index, None)
        if row is None:
            row = Accelerator(node_id=node_id, index=d.index)
            session.add(row)
        row.model, row.kind = d.model, d.kind
        row.memory_gb, row.measured_tflops = d.memory_gb, d.measured_tflops
        row.uuid, row.link_group = d.uuid, d.link_group
    if existing:
        # Allocation rows keep their accelerator for the job's history, so a device that has
        # ever been used cannot disappear from its node.
        used = set(
            session.scalars(
                select(Allocation.accelerator_id).where(
                    Allocation.accelerator_id.in_([a.id for a in existing.values()])
                )
            )
        )
        if used:
            gone = sorted(a.index for a in existing.values() if a.id in used)
            raise FailedPrecondition(
                f"devices: device(s) {gone} have allocation history and cannot be removed from node"
                f" {node_id}; register the changed machine as a new node",
                node_id=node_id,
            )
        for row in existing.values():
            session.delete(row)
    session.flush()
