"""Tenants and their keys, the audit log, calibration (admin); enrollment tokens and the planner's
snapshot (operators too)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from contracts.errors import NotFound
from control_layer.calibration_store import history, load_calibration
from control_layer.lifecycle import wake_placer
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.snapshot import build_snapshot
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import CalibrationFactor, Tenant
from resource_layer.tokens import create_enrollment_token
from service_layer import auth
from service_layer.audit import audit_request, list_audit
from service_layer.deps import AdminPrincipal, CtxDep, FleetManager, SessionDep
from service_layer.key_cache import forget_everywhere
from service_layer.schemas.calibration import CalibrationRead, ChangeRead, FactorRead
from service_layer.schemas.common import ROW_ID_MAX, error_responses
from service_layer.schemas.tenancy import (
    ApiKeyCreated,
    AuditRead,
    QuotaUpdate,
    TenantCreate,
    TenantRead,
    TokenCreate,
    TokenCreated,
)

router = APIRouter(tags=["admin"], responses=error_responses(401, 403))


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses=error_responses(422))
def create_token(ctx: CtxDep, admin: FleetManager, body: TokenCreate, request: Request) -> TokenCreated:
    """An enrollment token for `cpn agent --token`; shown once."""
    with session_scope(ctx.session_factory) as session:
        row, plaintext = create_enrollment_token(
            session, provider=body.provider, note=body.note, ttl_s=body.ttl_s, max_uses=body.max_uses
        )
        audit_request(session, request, admin, "token.created", f"token {row.id}", body.model_dump())
        return TokenCreated(
            id=row.id,
            token=plaintext,
            provider=row.provider,
            note=row.note,
            max_uses=row.max_uses,
            expires_at=as_utc(row.expires_at) if row.expires_at else None,
        )


@router.post("/tenants", status_code=201, response_model=TenantRead, responses=error_responses(409, 422))
def create_tenant(ctx: CtxDep, admin: AdminPrincipal, body: TenantCreate, request: Request) -> TenantRead:
    with session_scope(ctx.session_factory) as session:
        tenant = auth.create_tenant(session, body.name, body.is_admin)
        audit_request(session, request, admin, "tenant.created", f"tenant {tenant.id}", body.model_dump())
        return TenantRead.model_validate(tenant)


@router.get("/tenants", response_model=list[TenantRead])
def list_tenants(session: SessionDep, _: AdminPrincipal) -> list[TenantRead]:
    return [TenantRead.model_validate(t) for t in session.scalars(select(Tenant).order_by(Tenant.created_at))]


@router.put("/tenants/{tenant_id}/quota", response_model=TenantRead, responses=error_responses(404, 422))
def set_quota(
    ctx: CtxDep, admin: AdminPrincipal, tenant_id: str, body: QuotaUpdate, request: Request
) -> TenantRead:
    """Replace the tenant's quotas: `max_devices` (its jobs wait in the queue beyond it),
    `max_monthly_spend` (a submission over it → 402) and `max_artifact_bytes` (the artifact store;
    null: the server's default); null removes one. The placer's next pass
    applies them; submissions, within the seconds a verified key is cached."""
    with session_scope(ctx.session_factory) as session:
        tenant = session.get(Tenant, tenant_id, with_for_update=True)
        if tenant is None:
            raise NotFound(f"tenant {tenant_id} not found", field="tenant_id")
        tenant.max_devices, tenant.max_monthly_spend = body.max_devices, body.max_monthly_spend
        tenant.max_artifact_bytes = body.max_artifact_bytes
        audit_request(session, request, admin, "tenant.quota", f"tenant {tenant_id}", body.model_dump())
        read = TenantRead.model_validate(tenant)
        wake_placer(session, ctx.bus, "quota changed")
    forget_everywhere()  # this process's cached tenant rows carry the old caps
    return read


@router.post(
    "/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated, responses=error_responses(404)
)
def create_key(ctx: CtxDep, admin: AdminPrincipal, tenant_id: str, request: Request) -> ApiKeyCreated:
    """A new API key for the tenant, with the default role (admin for the platform tenant,
    tenant-admin otherwise; `POST /v1/keys` takes a role); the key is in this response only."""
    with session_scope(ctx.session_factory) as session:
        row, plaintext = auth.add_api_key(session, tenant_id)
        audit_request(session, request, admin, "key.created", f"tenant {tenant_id}", {"prefix": row.prefix})
        return ApiKeyCreated(
            id=row.id,
            tenant_id=row.tenant_id,
            prefix=row.prefix,
            role=row.role,
            key=plaintext,
            created_at=as_utc(row.created_at),
        )


@router.get("/snapshot", response_model=ResourceSnapshot, summary="The planner's resource snapshot")
def snapshot(ctx: CtxDep, session: SessionDep, _: FleetManager) -> ResourceSnapshot:
    """What the planner sees now: alive nodes, free devices, prices, links. Feed it to `cpn plan`."""
    return build_snapshot(session, link_fresh_s=ctx.settings.effective_link_fresh_s)


@router.get("/audit", response_model=list[AuditRead], summary="The audit log")
def audit_log(
    session: SessionDep,
    _: AdminPrincipal,
    after: Annotated[
        int, Query(ge=0, le=ROW_ID_MAX, description="Only entries with a larger id (a cursor)")
    ] = 0,
    action: Annotated[str | None, Query(max_length=64, description="e.g. price.changed")] = None,
    actor_id: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditRead]:
    """Every admin action and price change: who, what, when, from where; oldest first."""
    rows = list_audit(session, after=after, action=action, actor_id=actor_id, limit=limit)
    return [AuditRead.model_validate(r) for r in rows]


@router.get(
    "/calibration", response_model=CalibrationRead, summary="The planner's calibration and its history"
)
def calibration(
    session: SessionDep,
    _: AdminPrincipal,
    limit: Annotated[int, Query(ge=1, le=5000, description="History rows, newest first")] = 500,
) -> CalibrationRead:
    """Learned factors (efficiency per model|precision, start-up per node, goodput per region pair),
    the error bands quotes carry, and every change with the job that caused it."""
    factors = session.scalars(
        select(CalibrationFactor).order_by(CalibrationFactor.kind, CalibrationFactor.key)
    )
    return CalibrationRead(
        calibration=load_calibration(session),
        factors=[FactorRead.model_validate(f) for f in factors],
        history=[ChangeRead.model_validate(c) for c in history(session, limit)],
    )
