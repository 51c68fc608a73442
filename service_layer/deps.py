"""Request dependencies, declared once: the server context, a DB session, the calling tenant."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from contracts.errors import PermissionDenied
from orchestration.context import ServerContext
from orchestration.db.models import Tenant
from service_layer.auth import authenticate, hash_key
from service_layer.key_cache import KeyCache

_bearer = HTTPBearer(auto_error=False, description="A tenant API key: `Authorization: Bearer cpn_...`")


def get_ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


CtxDep = Annotated[ServerContext, Depends(get_ctx)]


def get_session(ctx: CtxDep) -> Iterator[Session]:
    """A read session for the request. Writes go through domain functions that own their
    transaction (with SQLite every transaction takes the write lock, so none is held here)."""
    with ctx.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _look_up(ctx: ServerContext, plaintext: str | None) -> Tenant:
    # A short session of its own, closed before the endpoint runs: the endpoint may write.
    with ctx.session_factory() as session:
        return authenticate(session, plaintext)


async def get_tenant(
    request: Request,
    ctx: CtxDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The key's tenant: from the few-second cache of verified keys on the event loop, else looked
    up in the database off it (``service_layer.key_cache``)."""
    plaintext = credentials.credentials if credentials else None
    digest = hash_key(plaintext) if plaintext else None
    keys: KeyCache = request.app.state.key_cache
    if digest is not None and (tenant := keys.get(digest)) is not None:
        return tenant
    tenant = await run_in_threadpool(_look_up, ctx, plaintext)
    if digest is not None:
        keys.put(digest, tenant)
    return tenant


CurrentTenant = Annotated[Tenant, Depends(get_tenant)]


def get_admin(tenant: CurrentTenant) -> Tenant:
    if not tenant.is_admin:
        raise PermissionDenied("this endpoint needs an admin API key")
    return tenant


AdminTenant = Annotated[Tenant, Depends(get_admin)]
