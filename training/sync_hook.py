"""Which cross-region engine a worker gets: the no-op for a single region, else the sync engine
(``training.sync.engine``). The contract both sides keep is in ``training.sync_protocol``."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from contracts.worker_config import WorkerConfig
from training.sync.engine import create_sync
from training.sync_protocol import CrossRegionSync, SyncContext


class NoOpSync:
    """A single-region job: nothing crosses a WAN."""

    def should_sync(self, step: int) -> bool:
        return False

    def syncs_gradients(self, step: int) -> bool:
        return False

    def reduce_gradients(self, step: int, grads: list[Tensor]) -> None:
        return None

    def after_step(self, step: int, model_params: list[Tensor]) -> None:
        return None

    def metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None

    def totals(self) -> dict[str, int]:
        return {}

    def local_steps(self, planned: int) -> int:
        return planned

    def job_step(self, step: int) -> float:
        return float(step)


def other_regions(cfg: WorkerConfig) -> list[str]:
    return sorted(r for r in cfg.sync.peers if r != cfg.region)


def build_sync(cfg: WorkerConfig, ctx: SyncContext) -> CrossRegionSync:
    """The no-op for a single region, else the engine (``training.sync.engine.create_sync``)."""
    if cfg.sync.mode == "none" or not other_regions(cfg):
        return NoOpSync()
    return create_sync(cfg, ctx)
