"""What a control-plane process hands to every layer: settings, the DB session factory and the bus."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from orchestration.artifacts.factory import make_store
from orchestration.artifacts.lookup import DbArtifactLookup
from orchestration.artifacts.store import ArtifactStore
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
    # Moves one job off its nodes (checkpoint, stop, requeue): ``preempt_job(ctx, job_id, *, reason,
    # by_job_id=None) -> bool``. A drain calls it for each job on the node, and the placer for the
    # victims a queued job of higher priority may displace (control_layer.victim_choice); None:
    # such jobs are left to finish where they run (a drain says so; the placer never preempts).
    preempt_job: Callable[..., bool] | None = field(default=None)
    # Users' code, data and outputs (``orchestration.artifacts``): built once per process, from
    # the settings, on first use (``server.build_context`` builds it at start).
    artifact_store: ArtifactStore | None = field(default=None, repr=False)

    # Users' code and data (``control_layer.user_data``): the artifact store's metadata
    # (``ArtifactLookup``: an uploaded blob's size per tenant; default: the artifacts table) and
    # its S3 side (``S3Store``; default: the store itself when it is S3, else None: ``s3://``
    # references are refused with a 422 rather than guessed).
    artifact_lookup: Any = field(default=None)
    s3_store: Any = field(default=None)

    @property
    def artifacts(self) -> ArtifactStore:
        if self.artifact_store is None:
            self.artifact_store = make_store(self.settings)
        return self.artifact_store

    def __post_init__(self) -> None:
        self.resource_changes = ResourceChangeFeed.for_factory(self.session_factory, self.bus)
        if self.artifact_lookup is None:
            self.artifact_lookup = DbArtifactLookup(self.session_factory)
        if self.s3_store is None and self.settings.artifact_store == "s3":
            self.s3_store = self.artifacts
