"""Domain exceptions shared by every layer.

Each carries a machine-readable ``code`` and structured ``details``; the edges map them to
HTTP status codes (service_layer) or gRPC status codes (resource_layer) and nothing else
ever needs to know about transport.
"""

from __future__ import annotations

from typing import Any


class CpnError(Exception):
    """Base class: a failure the caller can act on, with structured data."""

    code = "error"
    http_status = 500
    grpc_status = "INTERNAL"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class NotFound(CpnError):
    code = "not_found"
    http_status = 404
    grpc_status = "NOT_FOUND"


class InvalidArgument(CpnError):
    code = "invalid_argument"
    http_status = 422
    grpc_status = "INVALID_ARGUMENT"


class FailedPrecondition(CpnError):
    code = "failed_precondition"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class Conflict(CpnError):
    code = "conflict"
    http_status = 409
    grpc_status = "ALREADY_EXISTS"


class Unauthenticated(CpnError):
    code = "unauthenticated"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"


class PermissionDenied(CpnError):
    code = "permission_denied"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class NoFeasiblePlan(FailedPrecondition):
    """The planner found no option; ``details['explanation']`` says which constraint removed what."""

    code = "no_feasible_plan"
