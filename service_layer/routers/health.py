"""Liveness of what the control plane depends on: the database and the bus."""

from __future__ import annotations

import asyncio
import secrets

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from orchestration.context import ServerContext
from service_layer.deps import CtxDep
from service_layer.schemas.common import error_responses
from service_layer.schemas.resources import Health

router = APIRouter(tags=["health"])


def _check_db(ctx: ServerContext) -> str:
    try:
        with ctx.session_factory() as session:
            session.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"[:300]


def _check_bus(ctx: ServerContext) -> str:
    # A TTL key round trip works the same on both backends and needs a live connection on Redis.
    key = f"healthz.{secrets.token_hex(4)}"
    try:
        ctx.bus.touch(key, 2.0)
        return "ok" if ctx.bus.alive(key) else "error: liveness key did not read back"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"[:300]


@router.get("/healthz", response_model=Health, responses=error_responses(503))
async def healthz(ctx: CtxDep) -> JSONResponse:
    """200 when the database answers and the bus round-trips a key; 503 otherwise (no auth)."""
    db, bus = await asyncio.gather(asyncio.to_thread(_check_db, ctx), asyncio.to_thread(_check_bus, ctx))
    ok = db == "ok" and bus == "ok"
    body = Health(status="ok" if ok else "unavailable", database=db, bus=bus, replica=ctx.settings.replica_id)
    return JSONResponse(status_code=200 if ok else 503, content=body.model_dump())
