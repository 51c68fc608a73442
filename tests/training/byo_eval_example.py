"""A bring-your-own job with held-out data: the final model's loss on it is reported."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from training.byo import BYOJob


def data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(600, 8, generator=gen)
    y = x @ torch.randn(8, 2, generator=gen)
    return TensorDataset(x[:512], y[:512]), TensorDataset(x[512:], y[512:])


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def build(cfg: Any) -> BYOJob:
    train, held_out = data(cfg.data.seed)
    return BYOJob(model(), train, nn.functional.mse_loss, eval_dataset=held_out)
