"""API keys with roles, and enrollment tokens: list, create, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from contracts.errors import PermissionDenied
from orchestration.db.engine import session_scope
from resource_layer.tokens import list_enrollment_tokens, revoke_enrollment_token
from service_layer import auth
from service_layer.audit import audit_request
from service_layer.deps import CtxDep, FleetManager, KeyManager, SessionDep
from service_layer.key_cache import forget_everywhere
from service_layer.schemas.access import KeyCreate, KeyCreated, KeyRead, TokenRead
from service_layer.schemas.common import error_responses

Id = Annotated[str, Path(min_length=1, max_length=64)]

router = APIRouter(tags=["access"], responses=error_responses(401, 403))


@router.get("/keys", response_model=list[KeyRead], summary="API keys", responses=error_responses(422))
def list_keys(
    session: SessionDep,
    who: KeyManager,
    tenant_id: Annotated[str | None, Query(max_length=32, description="Admin: one tenant's only")] = None,
) -> list[KeyRead]:
    """Your tenant's keys, revoked ones included, oldest first; an admin sees every tenant's."""
    if not who.is_admin and tenant_id not in (None, who.id):
        raise PermissionDenied(
            "tenant_id: a tenant-admin lists its own tenant's keys only", field="tenant_id"
        )
    scope = tenant_id if who.is_admin else who.id
    return [KeyRead.model_validate(k) for k in auth.list_api_keys(session, scope)]


@router.post(
    "/keys",
    status_code=201,
    response_model=KeyCreated,
    summary="Create an API key",
    responses=error_responses(404, 422),
)
def create_key(ctx: CtxDep, who: KeyManager, body: KeyCreate, request: Request) -> KeyCreated:
    """A key with a role (member by default) and the member's name, for your own tenant (an admin:
    for `tenant_id`). A tenant-admin hands out member and tenant-admin keys. Shown once."""
    tenant_id = body.tenant_id or who.id
    with session_scope(ctx.session_factory) as session:
        row, plaintext = auth.add_api_key(session, tenant_id, role=body.role, name=body.name, granter=who)
        audit_request(
            session,
            request,
            who,
            "key.created",
            f"key {row.id}",
            {"tenant_id": tenant_id, "role": row.role, "name": row.name, "prefix": row.prefix},
        )
        return KeyCreated(**KeyRead.model_validate(row).model_dump(), key=plaintext)


@router.delete(
    "/keys/{key_id}", response_model=KeyRead, summary="Revoke an API key", responses=error_responses(404)
)
def revoke_key(ctx: CtxDep, who: KeyManager, key_id: Id, request: Request) -> KeyRead:
    """The key fails at once on this server and on other replicas within their key cache's few
    seconds (`key_cache.TTL_S`). Another tenant's key reads as not found. Revoking twice is a no-op."""
    with session_scope(ctx.session_factory) as session:
        key = auth.revoke_api_key(session, key_id, tenant_id=None if who.is_admin else who.id)
        audit_request(
            session,
            request,
            who,
            "key.revoked",
            f"key {key.id}",
            {"tenant_id": key.tenant_id, "role": key.role},
        )
        read = KeyRead.model_validate(key)
    forget_everywhere()  # again after the commit: no request between revocation and commit re-cached it
    return read


@router.get("/tokens", response_model=list[TokenRead], summary="Enrollment tokens")
def list_tokens(session: SessionDep, _: FleetManager) -> list[TokenRead]:
    """Every enrollment token (never its plaintext), with its uses, expiry and revocation; newest first."""
    return [TokenRead.model_validate(t) for t in list_enrollment_tokens(session)]


@router.delete(
    "/tokens/{token_id}",
    response_model=TokenRead,
    summary="Revoke an enrollment token",
    responses=error_responses(404),
)
def revoke_token(ctx: CtxDep, who: FleetManager, token_id: Id, request: Request) -> TokenRead:
    """The token enrolls nothing from now on. Nodes it already enrolled keep their credentials:
    revoke them with `DELETE /v1/nodes/{id}`."""
    with session_scope(ctx.session_factory) as session:
        row = revoke_enrollment_token(session, token_id)
        audit_request(session, request, who, "token.revoked", f"token {row.id}", {"provider": row.provider})
        return TokenRead.model_validate(row)
