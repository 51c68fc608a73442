"""Domain exceptions -> gRPC status codes, at the edge and nowhere else."""

from __future__ import annotations

import grpc

from contracts.errors import (
    Aborted,
    Conflict,
    CpnError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)

# Most specific first: a subclass (NoFeasiblePlan) takes its base's code unless listed itself.
_CODES: tuple[tuple[type[CpnError], grpc.StatusCode], ...] = (
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Conflict, grpc.StatusCode.ALREADY_EXISTS),
    (Aborted, grpc.StatusCode.ABORTED),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)


def status_code_for(exc: CpnError) -> grpc.StatusCode:
    """The status a domain exception stands for; an unmapped class is a bug, reported as INTERNAL."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


async def abort_with(context: grpc.aio.ServicerContext, exc: CpnError) -> None:
    """End the call with the status the exception stands for (``abort`` raises; it never returns)."""
    await context.abort(status_code_for(exc), exc.message)
