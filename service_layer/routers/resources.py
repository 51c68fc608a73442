"""The fleet as users and admins see it: regions, clusters with nodes and devices, links."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from contracts.registration import NAME_RE
from orchestration.db.engine import session_scope
from resource_layer.regions import set_jurisdiction
from service_layer import queries
from service_layer.audit import audit_request
from service_layer.deps import AdminPrincipal, CtxDep, FleetManager, FleetViewer, SessionDep
from service_layer.links import upsert_link
from service_layer.schemas.common import error_responses
from service_layer.schemas.resources import (
    ClusterRead,
    DeclaredLinkRead,
    JurisdictionSet,
    LinkProbeRead,
    LinkRead,
    LinkUpsert,
    RegionRead,
)

router = APIRouter(tags=["resources"])


@router.get("/regions", response_model=list[RegionRead], responses=error_responses(401))
def list_regions(session: SessionDep, _: FleetViewer) -> list[RegionRead]:
    """Regions with their cluster, alive-node and device counts."""
    return queries.list_regions(session)


RegionName = Annotated[str, Path(pattern=f"^{NAME_RE.pattern}$", max_length=63, description="e.g. eu-west")]


@router.put(
    "/regions/{name}/jurisdiction", response_model=RegionRead, responses=error_responses(401, 403, 422)
)
def put_jurisdiction(
    ctx: CtxDep, who: AdminPrincipal, name: RegionName, body: JurisdictionSet, request: Request
) -> RegionRead:
    """Admins: set and approve the region's jurisdiction, the only one data residency trusts (an
    agent's claim is not). A region no agent registered yet is created with it. From then on an
    agent claiming another jurisdiction is refused at registration (FAILED_PRECONDITION). Audited
    as `region.jurisdiction_set`, with the value it replaced."""
    with session_scope(ctx.session_factory) as session:
        change = set_jurisdiction(session, name, body.jurisdiction)
        audit_request(
            session,
            request,
            who,
            "region.jurisdiction_set",
            f"region {name}",
            {
                "jurisdiction": body.jurisdiction,
                "before": change.before,
                "before_approved": change.was_approved,
                "created": change.created,
                "reason": body.reason,
            },
        )
        session.flush()
        return next(r for r in queries.list_regions(session) if r.name == name)


@router.get("/clusters", response_model=list[ClusterRead], responses=error_responses(401))
def list_clusters(ctx: CtxDep, session: SessionDep, _: FleetViewer) -> list[ClusterRead]:
    """Clusters with their price in force, nodes (liveness, last heartbeat) and devices."""
    return queries.list_clusters(session, ctx.bus)


@router.get("/links", response_model=list[LinkRead], responses=error_responses(401))
def list_links(ctx: CtxDep, session: SessionDep, _: FleetViewer) -> list[LinkRead]:
    """The links the planner uses now, each marked `measured` (agents' probes, median of the newest
    fresh ones) or `declared` (an admin's `PUT /v1/links`, the fallback), with when and from what."""
    return queries.list_links(session, ctx.settings.effective_link_fresh_s)


@router.get("/links/probes", response_model=list[LinkProbeRead], responses=error_responses(401, 403, 422))
def list_link_probes(
    session: SessionDep, _: FleetManager, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[LinkProbeRead]:
    """Operators and admins: the newest link probes, ordered and measured (or failed), newest first."""
    return queries.list_link_probes(session, limit)


@router.put("/links", response_model=DeclaredLinkRead, responses=error_responses(401, 403, 404, 422))
def put_link(ctx: CtxDep, who: FleetManager, body: LinkUpsert, request: Request) -> DeclaredLinkRead:
    """Declare (or replace) the link src→dst; one direction serves both unless both are given.
    A fresh measurement of the same direction takes precedence in the planner."""
    with session_scope(ctx.session_factory) as session:
        link = upsert_link(session, **body.model_dump())
        audit_request(
            session, request, who, "link.declared", f"link {body.src}->{body.dst}", body.model_dump()
        )
        return DeclaredLinkRead.model_validate(link)
