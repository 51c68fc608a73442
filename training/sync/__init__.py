"""Cross-region sync between cluster leaders over gRPC: ``SyncEngine`` (see its docstring) with
its ``SyncConfig``; ``create_sync`` builds one from a worker config."""

from contracts.sync_config import SyncConfig
from training.sync.engine import SyncEngine, create_sync

__all__ = ["SyncConfig", "SyncEngine", "create_sync"]
