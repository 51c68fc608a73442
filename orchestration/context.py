"""What a control-plane process hands to every layer: settings, the DB session factory and the bus."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from orchestration.metrics import ServerMetrics
from orchestration.resource_changes import ResourceChangeFeed
from orchestration.settings import Settings

if TYPE_CHECKING:
    from orchestration.bus.base import Bus


@dataclass
class ServerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    bus: Bus
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    # Every context announces the resource rows its sessions change (see resource_changes), so
    # the in-memory snapshot of any replica can follow; control_layer attaches that snapshot here.
    resource_changes: ResourceChangeFeed = field(init=False)
    live_snapshot: Any = field(default=None, init=False)
    # How the placer preempts a running job for a queued one of higher priority:
    # ``preempt(ctx, job_id, *, reason, by_job_id) -> bool`` (checkpoint, stop, requeue; it must
    # tolerate being asked again while a preemption is under way). None: the placer never preempts.
    preempt: Callable[..., bool] | None = None

    def __post_init__(self) -> None:
        self.resource_changes = ResourceChangeFeed.for_factory(self.session_factory, self.bus)
