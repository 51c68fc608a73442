"""One training step's parts, as every rank runs them: the built-in GPT's stage, the optimizer,
forward and backward over the micro-batches, and the clipped gradients.

``training.runtime.Trainer`` drives them with data, timing and the cross-region hooks around;
``benchmarks/_memtrack.py`` runs the same parts under torch's memory tracker, so the memory the
planner prices is checked against this code and not a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from contracts.worker_config import WorkerConfig
from training.models.gpt import GPT
from training.parallel.dims import ParallelDims
from training.parallel.parallelize import grad_sync
from training.parallel.pipeline import split_stage

if TYPE_CHECKING:  # pipelining imports dynamo: loaded where a pipeline is built
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

ForwardLoss = Callable[[nn.Module, Any, Any], Tensor]


def build_gpt_stage(cfg: WorkerConfig, dims: ParallelDims) -> GPT:
    """The built-in GPT as this rank trains it: its pipeline stage, recomputation as configured."""
    assert cfg.model is not None
    dims.check_model(cfg.model)
    model = GPT(cfg.model, seed=cfg.training.seed)
    if dims.pp > 1:
        split_stage(model, dims.pp_rank, dims.pp)
    model.activation_checkpointing = cfg.training.activation_checkpointing
    return model


def build_optimizer(model: nn.Module, cfg: WorkerConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not biases, norms).

    On CUDA the fused kernel (``fused=True``): it updates every tensor in place, holding no
    temporary, where one parameter at a time took 82 ms of a 1B model's 385 ms step on an H200 in
    kernel launches. Elsewhere one parameter at a time (``foreach=False``): the multi-tensor update
    holds a temporary as large as all the parameters while it runs. The planner prices the larger,
    one-at-a-time temporaries (``memory_params._optimizer_temp``) on every device."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    t = cfg.training
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=t.lr, betas=t.betas, foreach=False, fused=fused or None
    )


def autocast(device: torch.device, bf16: bool) -> torch.autocast:
    """bf16: matmuls autocast to bfloat16; weights, gradients and AdamW state stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def forward_backward(
    model: nn.Module,
    schedule: PipelineScheduleSingle | None,
    dims: ParallelDims,
    cfg: WorkerConfig,
    forward_loss: ForwardLoss,
    x: Any,
    y: Any,
    device: torch.device,
) -> Tensor:
    """Forward and backward over the local batch: its micro-batches one after another (gradients
    accumulated, reduced on the last), or the pipeline schedule's. Returns the local mean loss."""
    bf16 = cfg.training.precision == "bf16"
    if schedule is not None:
        # The schedule interleaves forwards and backwards in one call, so autocast spans both;
        # backward ops run in the dtypes autocast chose for their forwards either way.
        with autocast(device, bf16):
            return _pipeline_step(schedule, dims, x, y, device)
    mb = cfg.micro_batch
    xs, ys = x.split(mb), y.split(mb)
    total = torch.zeros((), device=device)
    for i, (xm, ym) in enumerate(zip(xs, ys, strict=True)):
        with grad_sync(model, enabled=i == len(xs) - 1):
            with autocast(device, bf16):  # forward and loss only; backward outside, as autocast advises
                loss = forward_loss(model, xm, ym) / len(xs)
            loss.backward()
        total += loss.detach()
    return total


def _pipeline_step(
    schedule: PipelineScheduleSingle, dims: ParallelDims, x: Any, y: Any, device: torch.device
) -> Tensor:
    # The last stage's outputs (the logits) are not wanted, only the losses: returned, the
    # schedule would keep every micro-batch's logits to the end and then concatenate them.
    losses: list[Tensor] = []
    first, last = dims.pp_rank == 0, dims.pp_rank == dims.pp - 1
    if first:
        schedule.step(x, target=y, losses=losses, return_outputs=False)
    elif last:
        schedule.step(target=y, losses=losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)
    return torch.stack(losses).mean().detach() if last else torch.zeros((), device=device)


@torch.no_grad()
def clip_grad_norm(params: list[nn.Parameter], max_norm: float, dims: ParallelDims) -> Tensor:
    """Global L2 norm over the whole replica (DTensor shards and pipeline stages), then scale.

    The norm stays a tensor: reading it on the host would stall a GPU before every optimizer
    step (and cannot run on fake tensors, which the memory check measures the step with)."""
    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad, dtype=torch.float32)
        n = n.full_tensor() if isinstance(n, DTensor) else n
        sq += n.double().cpu() ** 2
    if dims.pp > 1:
        sq = sq.to(next(iter(params)).device)
        dist.all_reduce(sq, group=dims.mesh["pp"].get_group())
    total = sq.sqrt()
    coef = max_norm / (total + 1e-6)
    # Scaled only where the norm is over the bound (a NaN norm leaves the gradients as they are).
    coef = torch.where(coef < 1.0, coef, torch.ones_like(coef))
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return total
