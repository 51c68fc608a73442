"""The fleet as users and admins see it: regions, clusters with nodes and devices, links."""

from __future__ import annotations

from fastapi import APIRouter, Request

from orchestration.db.engine import session_scope
from service_layer import queries
from service_layer.audit import audit_request
from service_layer.deps import AdminTenant, CtxDep, CurrentTenant, SessionDep
from service_layer.links import upsert_link
from service_layer.schemas.common import error_responses
from service_layer.schemas.resources import ClusterRead, LinkRead, LinkUpsert, RegionRead

router = APIRouter(tags=["resources"])


@router.get("/regions", response_model=list[RegionRead], responses=error_responses(401))
def list_regions(session: SessionDep, _: CurrentTenant) -> list[RegionRead]:
    """Regions with their cluster, alive-node and device counts."""
    return queries.list_regions(session)


@router.get("/clusters", response_model=list[ClusterRead], responses=error_responses(401))
def list_clusters(ctx: CtxDep, session: SessionDep, _: CurrentTenant) -> list[ClusterRead]:
    """Clusters with their price in force, nodes (liveness, last heartbeat) and devices."""
    return queries.list_clusters(session, ctx.bus)


@router.get("/links", response_model=list[LinkRead], responses=error_responses(401))
def list_links(session: SessionDep, _: CurrentTenant) -> list[LinkRead]:
    return queries.list_links(session)


@router.put("/links", response_model=LinkRead, responses=error_responses(401, 403, 404, 422))
def put_link(ctx: CtxDep, admin: AdminTenant, body: LinkUpsert, request: Request) -> LinkRead:
    """Declare (or replace) the link src→dst; one direction serves both unless both are given."""
    with session_scope(ctx.session_factory) as session:
        link = upsert_link(session, **body.model_dump())
        audit_request(
            session, request, admin, "link.declared", f"link {body.src}->{body.dst}", body.model_dump()
        )
        return LinkRead.model_validate(link)
