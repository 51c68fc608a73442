"""Link probes on the control plane: order them (``run_link_prober``), store what comes back.

Every ``link_probe_tick_s`` the replica holding the bus lock reads the alive nodes that serve
probes and the newest probe of every ordered region pair, lets ``plan_round`` pick what is due,
records each order as a pending ``link_probes`` row, and, after the commit, sends the prober a
``LinkProbeOrder`` over its agent stream with a ticket signed by the target's probe key. The
prober reports a ``LinkProbeResult``; ``record_result`` checks it against the order and stores
the figures. History is bounded: the newest ``KEEP_PER_PAIR`` rows of each pair stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, InvalidArgument, NotFound
from contracts.link_probe import MAX_TICKET_TTL_S, Ticket, sign
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Cluster, Link, LinkProbe, Node
from orchestration.resource_changes import note_changes
from resource_layer.link_schedule import PairHistory, ProbeEndpoint, ProbePlan, ProbePolicy, plan_round
from resource_layer.link_view import DeclaredLink, EffectiveLink, Measurement, effective_links
from resource_layer.liveness import node_alive_key

log = logging.getLogger(__name__)

PROBE_LOCK = "link-probes"
KEEP_PER_PAIR = 50
MAX_RTT_MS = 60_000.0
MAX_BANDWIDTH_GBPS = 10_000.0  # the bound PUT /v1/links puts on a declared link


def _policy(ctx: ServerContext) -> ProbePolicy:
    s = ctx.settings
    return ProbePolicy(interval_s=s.link_probe_interval_s, budget=s.link_probe_budget)


def _endpoints(ctx: ServerContext, session: Session) -> list[ProbeEndpoint]:
    rows = session.execute(
        select(Node.id, Node.advertise_host, Node.probe_port, Node.registered_at, Cluster.region)
        .join(Cluster, Cluster.id == Node.cluster_id)
        # Not a node still measuring its profile: a probe's burst would land in its reference step.
        .where(Node.status == "alive", Node.measuring.is_(False), Node.probe_port > 0, Node.probe_key != "")
    ).all()
    return [
        ProbeEndpoint(r.id, r.region, r.advertise_host, r.probe_port, as_utc(r.registered_at).timestamp())
        for r in rows
        if ctx.bus.alive(node_alive_key(r.id))
    ]


def _history(session: Session) -> tuple[dict[tuple[str, str], PairHistory], set[str]]:
    """The newest probe per ordered pair, and the nodes with a probe pending."""
    newest = (
        select(LinkProbe.src_region, LinkProbe.dst_region, func.max(LinkProbe.requested_at).label("at"))
        .group_by(LinkProbe.src_region, LinkProbe.dst_region)
        .subquery()
    )
    rows = session.scalars(
        select(LinkProbe).join(
            newest,
            (LinkProbe.src_region == newest.c.src_region)
            & (LinkProbe.dst_region == newest.c.dst_region)
            & (LinkProbe.requested_at == newest.c.at),
        )
    ).all()
    history = {
        (r.src_region, r.dst_region): PairHistory(
            as_utc(r.requested_at).timestamp(), r.duration_s, r.status == "pending"
        )
        for r in rows
    }
    busy = set()
    for r in session.execute(
        select(LinkProbe.src_node_id, LinkProbe.dst_node_id).where(LinkProbe.status == "pending")
    ):
        busy |= {r.src_node_id, r.dst_node_id}
    return history, busy


def expire_pending(session: Session, timeout_s: float, now: datetime) -> int:
    """Pending probes older than ``timeout_s`` failed (the prober died or never answered)."""
    result = session.execute(
        update(LinkProbe)
        .where(LinkProbe.status == "pending", LinkProbe.requested_at < now - timedelta(seconds=timeout_s))
        .values(status="failed", error=f"no result within {timeout_s:g}s", finished_at=now)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def _order(plan: ProbePlan, probe_id: str, key: str, bulk_bytes: int, echoes: int, expires_at: float) -> dict:
    ticket = sign(key, Ticket(probe_id, plan.dst.node_id, bulk_bytes, echoes, expires_at))
    return {
        "probe": {
            "ticket": {
                "probe_id": ticket.probe_id,
                "target_node_id": ticket.target_node_id,
                "bulk_bytes": ticket.bulk_bytes,
                "echoes": ticket.echoes,
                "expires_at": ticket.expires_at,
                "mac": ticket.mac,
            },
            "target_host": plan.dst.host,
            "target_port": plan.dst.port,
        }
    }


def schedule_once(ctx: ServerContext, now: float | None = None) -> list[str]:
    """One round; returns the ids of the probes it ordered (none when another replica holds the lock)."""
    s = ctx.settings
    now = time.time() if now is None else now
    with ctx.bus.lock(PROBE_LOCK, ttl_s=max(10.0, 5 * s.link_probe_tick_s)) as held:
        if not held:
            return []
        orders: list[tuple[str, dict[str, Any]]] = []
        with session_scope(ctx.session_factory) as session:
            expire_pending(session, s.link_probe_timeout_s, utcnow())
            history, busy = _history(session)
            plans = plan_round(_endpoints(ctx, session), history, busy, now, _policy(ctx))
            # Whole seconds: the expiry crosses JSON and protobuf and must sign the same on both ends.
            expires_at = float(math.ceil(now + min(s.link_probe_timeout_s, MAX_TICKET_TTL_S)))
            for plan in plans:
                key = session.scalar(select(Node.probe_key).where(Node.id == plan.dst.node_id)) or ""
                row = LinkProbe(
                    src_region=plan.src.region,
                    dst_region=plan.dst.region,
                    src_node_id=plan.src.node_id,
                    dst_node_id=plan.dst.node_id,
                    bulk_bytes=s.link_probe_bytes,
                    echoes=s.link_probe_echoes,
                    requested_at=utcnow(),
                )
                session.add(row)
                session.flush()
                orders.append(
                    (plan.src.node_id, _order(plan, row.id, key, row.bulk_bytes, row.echoes, expires_at))
                )
        # After the commit: a result can only arrive for a probe the database already holds.
        for node_id, message in orders:
            ctx.bus.publish(f"node.{node_id}", message)
            log.info("link probe %s ordered: node %s", message["probe"]["ticket"]["probe_id"], node_id)
        return [m["probe"]["ticket"]["probe_id"] for _, m in orders]


def record_result(
    session: Session, node_id: str, result: dict[str, Any], now: datetime | None = None
) -> LinkProbe:
    """Store what node ``node_id`` measured for one of its pending probes (the caller commits)."""
    now = now or utcnow()
    probe_id = str(result.get("probe_id", ""))
    row = session.get(LinkProbe, probe_id) if probe_id else None
    if row is None or row.src_node_id != node_id:
        raise NotFound(f"probe_id: no probe {probe_id!r} was ordered from this node", field="probe_id")
    if row.status != "pending":
        raise FailedPrecondition(f"probe {probe_id} is already {row.status}")
    error = str(result.get("error", ""))[:500]
    rtt_ms, nbytes, bulk_s, duration_s = (
        result.get("rtt_ms", 0.0),
        result.get("bulk_bytes", 0),
        result.get("bulk_s", 0.0),
        result.get("duration_s", 0.0),
    )
    if not all(
        isinstance(x, int | float) and math.isfinite(x) and x >= 0
        for x in (rtt_ms, nbytes, bulk_s, duration_s)
    ):
        raise InvalidArgument("probe_result: figures must be finite and non-negative", field="probe_result")
    if duration_s <= MAX_TICKET_TTL_S:
        row.duration_s = float(duration_s)
    row.finished_at = now
    if not error:
        if not (0 < rtt_ms <= MAX_RTT_MS and 0 < nbytes <= row.bulk_bytes and bulk_s > 0):
            error = f"implausible figures: rtt {rtt_ms} ms, {nbytes} of {row.bulk_bytes} bytes in {bulk_s} s"
        else:
            gbps = nbytes * 8 / bulk_s / 1e9
            if gbps > MAX_BANDWIDTH_GBPS:
                error = f"implausible bandwidth {gbps:.1f} Gbit/s"
            else:
                row.rtt_ms, row.bandwidth_gbps, row.status = float(rtt_ms), gbps, "ok"
                note_changes(session, topology=True)  # every replica's live snapshot re-reads its links
    if error:
        row.status, row.error = "failed", error
    session.flush()
    _prune(session, row.src_region, row.dst_region)
    return row


def _prune(session: Session, src: str, dst: str) -> None:
    keep = session.scalars(
        select(LinkProbe.id)
        .where(LinkProbe.src_region == src, LinkProbe.dst_region == dst)
        .order_by(LinkProbe.requested_at.desc())
        .limit(KEEP_PER_PAIR)
    ).all()
    session.execute(
        delete(LinkProbe).where(
            LinkProbe.src_region == src, LinkProbe.dst_region == dst, LinkProbe.id.not_in(keep)
        )
    )


def measurements(session: Session) -> list[Measurement]:
    """Every successful probe still in the history, as the link view takes them."""
    rows = session.scalars(select(LinkProbe).where(LinkProbe.status == "ok")).all()
    return [
        Measurement(
            src=r.src_region,
            dst=r.dst_region,
            bandwidth_gbps=r.bandwidth_gbps or 0.0,
            rtt_ms=r.rtt_ms or 0.0,
            measured_at=as_utc(r.finished_at or r.requested_at),
            src_node_id=r.src_node_id,
            dst_node_id=r.dst_node_id,
            bulk_bytes=r.bulk_bytes,
        )
        for r in rows
    ]


def current_links(session: Session, fresh_s: float, now: datetime | None = None) -> list[EffectiveLink]:
    """The links in force: fresh measurements first, declared links as the fallback."""
    declared = [
        DeclaredLink(
            ln.src,
            ln.dst,
            ln.bandwidth_gbps,
            ln.latency_ms,
            ln.egress_price_per_gb,
            as_utc(ln.measured_at),
            ln.private,
        )
        for ln in session.scalars(select(Link))
    ]
    return effective_links(declared, measurements(session), now or utcnow(), fresh_s)


async def run_link_prober(ctx: ServerContext, stop: asyncio.Event) -> None:
    """Order due probes every ``link_probe_tick_s`` until ``stop``; a failed round is logged, not fatal."""
    while not stop.is_set():
        try:
            await asyncio.to_thread(schedule_once, ctx)
        except Exception:
            log.exception("link probe round failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ctx.settings.link_probe_tick_s)
