"""A bring-your-own job for the tests: linear regression onto a fixed random map."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from training.byo import BYOJob


def build(cfg: Any) -> BYOJob:
    gen = torch.Generator().manual_seed(cfg.data.seed)
    x = torch.randn(512, 8, generator=gen)
    w = torch.randn(8, 2, generator=gen)
    y = x @ w + 0.01 * torch.randn(512, 2, generator=gen)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 2))
    return BYOJob(model=model, dataset=TensorDataset(x, y), loss_fn=nn.functional.mse_loss)
