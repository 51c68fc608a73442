"""The job's entrypoint, ``train:build``: cpn calls it on every worker and runs the loop.

The worker's ``cfg.data.path`` is the region's shard as the agent staged it (a resident shard
never leaves its region); the held-out text is regenerated here, so every region and the user
evaluate on the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from corpus import heldout_text
from model import CharConfig, CharModel, lm_loss
from torch.utils.data import Dataset

from training.byo import BYOJob

CONFIG = CharConfig()


class CharWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``seq_len + 1`` bytes: input and the next-byte target."""

    def __init__(self, data: bytes, seq_len: int) -> None:
        ids = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64)).clamp_(
            max=CONFIG.vocab - 1
        )
        n = (len(ids) - 1) // seq_len
        self.x = ids[: n * seq_len].view(n, seq_len)
        self.y = ids[1 : n * seq_len + 1].view(n, seq_len)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def eval_dataset() -> CharWindows:
    return CharWindows(heldout_text().encode(), CONFIG.seq_len)


def build(cfg: Any) -> BYOJob:
    shard = Path(cfg.data.path).read_bytes()
    return BYOJob(
        model=CharModel(CONFIG),
        dataset=CharWindows(shard, CONFIG.seq_len),
        loss_fn=lm_loss,
        eval_dataset=eval_dataset(),
    )
