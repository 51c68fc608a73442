"""Request dependencies, declared once: the server context, a DB session, who calls, and one
dependency per permission (``contracts.roles``): every route declares exactly one of those."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from contracts.roles import Permission, Principal
from orchestration.context import ServerContext
from service_layer.auth import authenticate, hash_key
from service_layer.key_cache import KeyCache

_bearer = HTTPBearer(auto_error=False, description="A tenant API key: `Authorization: Bearer cpn_...`")


# Dependencies that do not block are ``async def``: FastAPI runs a plain ``def`` dependency in its
# threadpool, a thread hop on every request for a field read.
async def get_ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


CtxDep = Annotated[ServerContext, Depends(get_ctx)]


def get_session(ctx: CtxDep) -> Iterator[Session]:
    """A read session for the request. Writes go through domain functions that own their
    transaction (with SQLite every transaction takes the write lock, so none is held here)."""
    with ctx.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _look_up(ctx: ServerContext, plaintext: str | None) -> Principal:
    # A short session of its own, closed before the endpoint runs: the endpoint may write.
    with ctx.session_factory() as session:
        return authenticate(session, plaintext)


async def _principal(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    """The key's tenant and role: from the few-second cache of verified keys on the event loop,
    else looked up in the database off it (``service_layer.key_cache``)."""
    plaintext = credentials.credentials if credentials else None
    digest = hash_key(plaintext) if plaintext else None
    keys: KeyCache = request.app.state.key_cache
    if digest is not None and (principal := keys.get(digest)) is not None:
        return principal
    principal = await run_in_threadpool(_look_up, request.app.state.ctx, plaintext)
    if digest is not None:
        keys.put(digest, principal)
    return principal


def _requiring(permission: Permission) -> object:
    # One flat dependency (the bearer scheme its only sub-dependency, which documents the
    # security scheme): FastAPI resolves each nested dependency on every request, at a cost
    # comparable to the rest of a small request.
    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Principal:
        return (await _principal(request, credentials)).require(permission)

    dependency.__name__ = f"require_{permission.value.replace('-', '_')}"
    dependency.permission = permission  # type: ignore[attr-defined]  # read by the route audit test
    return Depends(dependency)


# One per permission; a route takes exactly one of these (tests/service_layer/test_route_roles.py).
FleetViewer = Annotated[Principal, _requiring(Permission.VIEW_FLEET)]
JobRunner = Annotated[Principal, _requiring(Permission.RUN_JOBS)]
KeyManager = Annotated[Principal, _requiring(Permission.MANAGE_KEYS)]
FleetManager = Annotated[Principal, _requiring(Permission.MANAGE_FLEET)]
AdminPrincipal = Annotated[Principal, _requiring(Permission.ADMINISTER)]

# The names routes used before keys had roles.
CurrentTenant = JobRunner
AdminTenant = AdminPrincipal
