"""What a control-plane process hands to every layer: settings, the DB session factory and the bus."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from orchestration.metrics import ServerMetrics
from orchestration.settings import Settings

if TYPE_CHECKING:
    from orchestration.bus.base import Bus


@dataclass
class ServerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    bus: Bus
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
