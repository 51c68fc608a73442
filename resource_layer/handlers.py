"""What the resource layer calls in the control layer, registered at start by the composition root.

The gRPC edge hands task reports to the control layer and asks it what a reconnecting node should
run. It never imports the control layer: ``service_layer.server`` builds a ``ControlHandlers`` from
the control layer's functions and passes it in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from orchestration.context import ServerContext


class OnTaskStatus(Protocol):
    def __call__(
        self,
        ctx: ServerContext,
        node_id: str,
        assignment_id: str,
        state: str,
        message: str = "",
        exit_code: int | None = None,
        result: dict[str, Any] | None = None,
        lost: bool = False,
    ) -> None: ...


class OnTaskMetrics(Protocol):
    def __call__(
        self, ctx: ServerContext, node_id: str, assignment_id: str, metrics: dict[str, Any]
    ) -> None: ...


class PendingAssignments(Protocol):
    def __call__(self, ctx: ServerContext, node_id: str) -> list[dict[str, Any]]: ...


class OnCheckpointCopyResult(Protocol):
    def __call__(self, ctx: ServerContext, node_id: str, result: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ControlHandlers:
    """Synchronous callables (the servicer runs them in a worker thread); they raise CpnError to refuse."""

    on_task_status: OnTaskStatus
    on_task_metrics: OnTaskMetrics
    pending_assignments: PendingAssignments
    on_checkpoint_copy_result: OnCheckpointCopyResult
