"""How often a job checkpoints: the longest gap that still bounds lost work, the shortest that keeps
checkpoint writes within a share of the run. Pure: numbers in, numbers out."""

from __future__ import annotations

import math

import numpy as np

MAX_CHECKPOINT_FRACTION = 0.02  # at most 2 % of the run goes to writing checkpoints
# A checkpoint holds fp32 weights and AdamW's two fp32 moments per parameter.
CHECKPOINT_BYTES_PER_PARAM = 12
# Local disk through torch.distributed.checkpoint's serialiser; the fixed part is its planning,
# file creation and the closing barrier, which a small model pays in full. Measured with DCP on a
# shared 2-core CPU host (2026-11-23): 0.5M parameters 0.16-0.23 s, 3.4M 0.44-0.83 s, 19.5M
# 2.1-4.4 s. On a faster disk the writes take under 2 % and the interval is longer than needed.
CHECKPOINT_WRITE_GBPS = 0.1
CHECKPOINT_FIXED_S = 0.15


def checkpoint_write_s(n_params: int, replicas_per_node: int = 1) -> float:
    """Seconds one node takes to write its share of a checkpoint. Replicas on one node hold the
    same weights and DCP writes them once, so the node writes one replica's worth."""
    if n_params < 0 or replicas_per_node < 1:
        raise ValueError(f"n_params ({n_params}) and replicas_per_node ({replicas_per_node}) out of range")
    return CHECKPOINT_FIXED_S + n_params * CHECKPOINT_BYTES_PER_PARAM / (CHECKPOINT_WRITE_GBPS * 1e9)


def checkpoint_every(
    step_s: float, write_s: float, steps: int, max_fraction: float = MAX_CHECKPOINT_FRACTION
) -> int:
    """The smallest interval N (steps) whose writes, the final step's included, take at most
    ``max_fraction`` of the run; ``steps`` when even the final write alone takes more. A smaller
    N loses less work on a failure."""
    if not (math.isfinite(step_s) and math.isfinite(write_s)) or step_s < 0 or write_s < 0:
        raise ValueError(f"step_s ({step_s}) and write_s ({write_s}) must be finite and >= 0")
    if steps < 1 or not 0 < max_fraction < 1:
        raise ValueError(f"steps ({steps}) must be >= 1 and max_fraction ({max_fraction}) in (0, 1)")
    return int(checkpoint_intervals(np.asarray(step_s, dtype=float), write_s, steps, max_fraction))


def checkpoint_intervals(
    step_s: np.ndarray, write_s: float, steps: int, max_fraction: float = MAX_CHECKPOINT_FRACTION
) -> np.ndarray:
    """``checkpoint_every`` over an array of step times (the search's placements), unchecked:
    step times are finite and ≥ 0 there."""
    if write_s == 0:
        return np.ones(np.shape(step_s), dtype=np.int64)
    # k writes of write_s within the fraction: k * w <= f / (1 - f) * steps * step_s
    k_max = np.floor(max_fraction / (1 - max_fraction) * steps * step_s / write_s + 1e-9)
    every = np.clip(np.ceil(steps / np.maximum(k_max, 1)), 1, steps)
    return np.where(k_max < 1, steps, every).astype(np.int64)


def checkpoint_fraction(step_s: float, write_s: float, every: int, steps: int) -> float:
    """Share of the run spent writing checkpoints at interval ``every`` (final save included)."""
    writes = math.ceil(steps / every)
    total = steps * step_s + writes * write_s
    return writes * write_s / total if total > 0 else 0.0
