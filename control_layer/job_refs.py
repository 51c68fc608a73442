"""A job's code, data and outputs checked against this control plane: its store, settings, fleet
(``control_layer.user_data`` holds the rules; this is the glue to the server's context)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.job_spec import JobSpec
from control_layer.live_snapshot import current_snapshot
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.staging import NodeStaging
from control_layer.user_data import (
    NodeStagingFacts,
    ResolvedRefs,
    Unreachable,
    http_head_size,
    resolve_refs,
)
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Node, NodeCacheEntry


def fleet_regions(snapshot: ResourceSnapshot) -> set[str]:
    """The regions the fleet has: declared ones and those its clusters sit in."""
    return {r.name for r in snapshot.regions} | {c.region for c in snapshot.clusters}


def resolve_job_refs(
    ctx: ServerContext, tenant_id: str, spec: JobSpec, regions: set[str] | None = None, *, strict: bool = True
) -> ResolvedRefs:
    """``user_data.resolve_refs`` with this control plane's store, settings and fleet."""
    if regions is None:
        with session_scope(ctx.session_factory) as session:
            regions = fleet_regions(current_snapshot(ctx, session))
    return resolve_refs(
        spec,
        tenant_id,
        regions=regions,
        artifacts=ctx.artifact_lookup,
        s3=ctx.s3_store,
        output_allow=ctx.settings.outputs_allow,
        head=http_head_size if strict else _head_or_unknown,
    )


def _head_or_unknown(url: str, timeout_s: float) -> int | None:
    try:
        return http_head_size(url, timeout_s)
    except Unreachable:
        return None


def node_staging_facts(session: Session, refs: ResolvedRefs, spec: JobSpec) -> NodeStagingFacts:
    """What every node measured of staging (its agent's store probe and venv build), and which of
    this job's blobs and venvs each holds in its cache, as the agents last reported them."""
    measured = {}
    for node_id, probe in session.execute(
        select(Node.id, Node.staging_probe).where(Node.staging_probe.is_not(None))
    ):
        figures = {k: probe.get(k) for k in ("fetch_fixed_s", "bytes_per_s", "venv_s")}
        if all(isinstance(v, int | float) and v >= 0 for v in figures.values()):
            measured[node_id] = NodeStaging(**figures)
    blobs, reqs = refs.digests(spec)
    cached: dict[str, list[str]] = {}
    venvs: dict[str, list[str]] = {}
    wanted = [*blobs, *reqs]
    if wanted:
        rows = session.execute(
            select(NodeCacheEntry.node_id, NodeCacheEntry.kind, NodeCacheEntry.digest).where(
                NodeCacheEntry.digest.in_(wanted)
            )
        )
        for node_id, kind, digest in rows:
            (venvs if kind == "venv" else cached).setdefault(node_id, []).append(digest)
    return NodeStagingFacts(measured=measured, cached=cached, venvs=venvs)
