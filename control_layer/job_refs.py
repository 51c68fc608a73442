"""A job's code, data and outputs checked against this control plane: its store, settings, fleet
(``control_layer.user_data`` holds the rules; this is the glue to the server's context)."""

from __future__ import annotations

from contracts.job_spec import JobSpec
from control_layer.live_snapshot import current_snapshot
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.user_data import ResolvedRefs, Unreachable, http_head_size, resolve_refs
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope


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
