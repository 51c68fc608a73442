"""The event bus: the ``Bus`` protocol, in-process and Redis backends, and ``make_bus``."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from orchestration.bus.base import Bus, Message
from orchestration.bus.inprocess import InProcessBus
from orchestration.bus.redis_bus import RedisBus
from orchestration.settings import Settings


def default_prefix(settings: Settings) -> str:
    """``cpn:<database name>:``: replicas of one deployment share a database and so a bus, while
    deployments (or test runs) that share a Redis but not a database never hear each other."""
    name = make_url(settings.effective_database_url).database or "default"
    return "cpn:" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name.rsplit("/", 1)[-1]) + ":"


def make_bus(settings: Settings, prefix: str | None = None) -> Bus:
    """Redis when ``settings.redis_url`` is set, otherwise an in-process bus (single replica only)."""
    if settings.redis_url:
        return RedisBus(settings.redis_url, prefix=prefix if prefix is not None else default_prefix(settings))
    return InProcessBus()


__all__ = ["Bus", "InProcessBus", "Message", "RedisBus", "default_prefix", "make_bus"]
