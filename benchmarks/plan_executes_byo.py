"""The bring-your-own job the executability benchmark plans and runs: a small regression model.

Its entrypoint is ``plan_executes_byo:build`` (the benchmark puts benchmarks/ on PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from training.byo import BYOJob


def build(cfg: Any) -> BYOJob:
    gen = torch.Generator().manual_seed(cfg.data.seed)
    x = torch.randn(256, 8, generator=gen)
    y = x @ torch.randn(8, 2, generator=gen)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return BYOJob(model=model, dataset=TensorDataset(x, y), loss_fn=nn.functional.mse_loss)
