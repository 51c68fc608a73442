"""Pipeline parallelism: cut the GPT into stages by layer ranges and drive them with
``torch.distributed.pipelining`` (GPipe or 1F1B).

A stage is the GPT itself with the parts it does not own removed (embeddings kept only on the
first stage, final norm and head only on the last), so parameter names match the full model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from training.models.gpt import GPT
from training.parallel.dims import ParallelDims

if TYPE_CHECKING:  # torch's pipelining imports dynamo (~0.6 s a process): only where pp > 1
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle


def stage_layer_ranges(n_layers: int, pp: int) -> list[range]:
    """Contiguous, as even as possible; earlier stages take the remainder."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def split_stage(model: GPT, stage: int, pp: int) -> GPT:
    """Prune ``model`` in place to pipeline stage ``stage`` of ``pp``."""
    keep = stage_layer_ranges(model.cfg.n_layers, pp)[stage]
    for name in list(model.layers.keys()):
        if int(name) not in keep:
            del model.layers[name]
    if stage > 0:
        model.tok_emb = None
        model.pos_emb = None
    if stage < pp - 1:
        model.norm = None
        model.lm_head = None
    return model


def build_schedule(
    stage_module: nn.Module,
    dims: ParallelDims,
    device: torch.device,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
) -> PipelineScheduleSingle:
    """One stage per pp rank. ``loss_fn`` is a per-microbatch mean; gradients are scaled by
    1/microbatches, so a step equals one step on the whole local batch."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(
        stage_module,
        stage_index=dims.pp_rank,
        num_stages=dims.pp,
        device=device,
        group=dims.mesh["pp"].get_group(),
    )
    cls = Schedule1F1B if dims.pp_schedule == "1f1b" else ScheduleGPipe
    return cls(stage, n_microbatches=dims.microbatches, loss_fn=loss_fn)
