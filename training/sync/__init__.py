"""Cross-region sync between cluster leaders over gRPC (``docs/sync.md``): ``create_engine`` builds
a ``SyncEngine`` from a ``SyncConfig``; ``create_sync`` does the same from a worker config."""

from contracts.sync_config import SyncConfig
from contracts.sync_delay import overlap_delay_steps
from training.sync.engine import SyncEngine, create_engine, create_sync

__all__ = ["SyncConfig", "SyncEngine", "create_engine", "create_sync", "overlap_delay_steps"]
