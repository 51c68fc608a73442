"""Domain exceptions shared by every layer and by the code that runs on provider nodes.

Each carries a machine-readable ``code`` and structured ``details``, and nothing about transport:
the edges map classes to HTTP status codes (``service_layer.errors``) or gRPC status codes
(``resource_layer.grpc_errors``, ``training.sync.transport``).
"""

from __future__ import annotations

from typing import Any


class CpnError(Exception):
    """Base class: a failure the caller can act on, with structured data."""

    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class NotFound(CpnError):
    code = "not_found"


class InvalidArgument(CpnError):
    code = "invalid_argument"


class FailedPrecondition(CpnError):
    code = "failed_precondition"


class Conflict(CpnError):
    """The request collides with what exists (a duplicate), or with a concurrent change."""

    code = "conflict"


class Aborted(CpnError):
    """A concurrent change won; the same request may simply be tried again."""

    code = "aborted"


class ResourceExhausted(CpnError):
    """A per-caller limit is reached (open streams, request rate); retry once usage drops."""

    code = "resource_exhausted"


class PaymentRequired(CpnError):
    """A spending cap would be exceeded; ``details`` name the cap, the spend so far and the estimate."""

    code = "payment_required"


class PayloadTooLarge(CpnError):
    """A body (an upload) is over the limit that applies to it; ``details`` name the limit."""

    code = "payload_too_large"


class QuotaExceeded(PayloadTooLarge):
    """Storing this would take the tenant past its storage quota; ``details`` name the numbers."""

    code = "quota_exceeded"


class Unauthenticated(CpnError):
    code = "unauthenticated"


class PermissionDenied(CpnError):
    code = "permission_denied"


class NoFeasiblePlan(FailedPrecondition):
    """The planner found no option; ``details['explanation']`` says which constraint removed what."""

    code = "no_feasible_plan"
