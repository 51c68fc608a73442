"""Domain exceptions -> gRPC status codes, at the edge and nowhere else."""

from __future__ import annotations

import grpc

from orchestration.errors import CpnError


def status_code_for(exc: CpnError) -> grpc.StatusCode:
    """Each domain exception names its gRPC status; an unknown name is a bug, reported as INTERNAL."""
    return getattr(grpc.StatusCode, exc.grpc_status, grpc.StatusCode.INTERNAL)


async def abort_with(context: grpc.aio.ServicerContext, exc: CpnError) -> None:
    """End the call with the status the exception stands for (``abort`` raises; it never returns)."""
    await context.abort(status_code_for(exc), exc.message)
