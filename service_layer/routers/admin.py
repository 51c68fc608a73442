"""Admin-only: enrollment tokens, tenants and their keys, the planner's snapshot."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.snapshot import build_snapshot
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Tenant
from resource_layer.tokens import create_enrollment_token
from service_layer import auth
from service_layer.deps import AdminTenant, CtxDep, SessionDep
from service_layer.schemas.common import error_responses
from service_layer.schemas.tenancy import ApiKeyCreated, TenantCreate, TenantRead, TokenCreate, TokenCreated

router = APIRouter(tags=["admin"], responses=error_responses(401, 403))


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses=error_responses(422))
def create_token(ctx: CtxDep, _: AdminTenant, body: TokenCreate) -> TokenCreated:
    """An enrollment token for `cpn agent --token`; shown once."""
    with session_scope(ctx.session_factory) as session:
        row, plaintext = create_enrollment_token(
            session, note=body.note, ttl_s=body.ttl_s, max_uses=body.max_uses
        )
        return TokenCreated(
            id=row.id,
            token=plaintext,
            note=row.note,
            max_uses=row.max_uses,
            expires_at=as_utc(row.expires_at) if row.expires_at else None,
        )


@router.post("/tenants", status_code=201, response_model=TenantRead, responses=error_responses(409, 422))
def create_tenant(ctx: CtxDep, _: AdminTenant, body: TenantCreate) -> TenantRead:
    with session_scope(ctx.session_factory) as session:
        return TenantRead.model_validate(auth.create_tenant(session, body.name, body.is_admin))


@router.get("/tenants", response_model=list[TenantRead])
def list_tenants(session: SessionDep, _: AdminTenant) -> list[TenantRead]:
    return [TenantRead.model_validate(t) for t in session.scalars(select(Tenant).order_by(Tenant.created_at))]


@router.post(
    "/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated, responses=error_responses(404)
)
def create_key(ctx: CtxDep, _: AdminTenant, tenant_id: str) -> ApiKeyCreated:
    """A new API key for the tenant; the key is in this response only."""
    with session_scope(ctx.session_factory) as session:
        row, plaintext = auth.add_api_key(session, tenant_id)
        return ApiKeyCreated(
            id=row.id,
            tenant_id=row.tenant_id,
            prefix=row.prefix,
            key=plaintext,
            created_at=as_utc(row.created_at),
        )


@router.get("/snapshot", response_model=ResourceSnapshot, summary="The planner's resource snapshot")
def snapshot(session: SessionDep, _: AdminTenant) -> ResourceSnapshot:
    """What the planner sees now: alive nodes, free devices, prices, links. Feed it to `cpn plan`."""
    return build_snapshot(session)
