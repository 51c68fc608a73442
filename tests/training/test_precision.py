"""bf16 autocast and activation checkpointing take effect in the real trainer, as the planner prices them:
matmuls in bf16 with fp32 weights and optimizer state; recomputation that keeps fewer activations and
changes no gradient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from contracts.worker_config import parse_worker_config
from tests.training.harness import tiny_config
from training.parallel.init import compute_init
from training.runtime import Trainer, build_trainer


@pytest.fixture
def trainer_for(tmp_path: Path) -> Iterator[Any]:
    """Trainers in this process (one-rank gloo group), torn down after the test."""

    def make(**training: Any) -> Trainer:
        raw = tiny_config(tmp_path, training=training, checkpoint={"dir": None})
        raw["model"] = {"n_layers": 3, "d_model": 32, "n_heads": 4, "vocab": 32, "seq_len": 16}
        cfg = parse_worker_config(raw)
        return build_trainer(cfg, compute_init("cpu"))

    yield make
    if dist.is_initialized():
        dist.destroy_process_group()


def _grads_and_saved(trainer: Trainer) -> tuple[dict[str, torch.Tensor], int]:
    x, y = trainer.stream.batch(1, trainer.cfg.local_batch)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer._forward_backward(x, y)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return grads, saved


def test_activation_checkpointing_keeps_fewer_activations_and_the_same_gradients(trainer_for: Any) -> None:
    plain_grads, plain_saved = _grads_and_saved(trainer_for())
    ac_grads, ac_saved = _grads_and_saved(trainer_for(activation_checkpointing=True))
    assert ac_saved < 0.6 * plain_saved, (ac_saved, plain_saved)
    assert plain_grads.keys() == ac_grads.keys()
    for name, g in plain_grads.items():
        torch.testing.assert_close(ac_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_bf16_autocasts_matmuls_and_keeps_fp32_weights_and_optimizer_state(trainer_for: Any) -> None:
    fp32 = trainer_for()
    bf16 = trainer_for(precision="bf16")
    seen: dict[str, torch.dtype] = {}
    linear = next(m for m in bf16.model.modules() if isinstance(m, torch.nn.Linear))

    def record(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        seen.setdefault("dtype", out.dtype)

    linear.register_forward_hook(record)

    m32, m16 = fp32.train_step(), bf16.train_step()
    assert seen["dtype"] == torch.bfloat16
    assert m16["precision"] == "bf16" and m32["precision"] == "fp32"
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    for state in bf16.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    # same weights, same batch: the first loss differs only by bf16 rounding
    assert m16["loss"] == pytest.approx(m32["loss"], rel=2e-2)
