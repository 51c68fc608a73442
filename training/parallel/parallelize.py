"""How to shard the GPT: TP plan, FSDP2 / DDP wrapping, in the order torchtitan applies them.

Order matters: pipeline split first (``pipeline.split_stage``), then TP (turns weights into DTensors
on the tp mesh), then data parallelism over the dp mesh (FSDP2 composes with TP into 2-D sharding).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

from contracts.model import TP_PLAN
from training.models.gpt import GPT
from training.parallel.dims import ParallelDims


def apply_tp(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Megatron-style, by ``contracts.model.TP_PLAN``: q/k/v and fc column-parallel, output
    projections row-parallel.

    Each rank holds n_heads/tp heads and 1/tp of the MLP; one all-reduce per sub-block forward (and
    one in backward). Embeddings, norms and the head stay replicated across the tp group (the
    planner prices them so, from the same plan).
    """
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {name: styles[style]() for name, style in TP_PLAN.items()})


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> None:
    """FSDP2: one all-gather unit per block plus the root (embeddings, head)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleDict):
        for block in layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, pipelined: bool) -> DDP:
    # Under pipelining DDP sees several backward passes per step; its first-iteration bucket rebuild
    # then records every parameter once per microbatch and fails an internal size check on step 2.
    # find_unused_parameters=True turns the rebuild off (the buckets keep registration order).
    return DDP(model, process_group=dp_mesh.get_group(), find_unused_parameters=pipelined)


def parallelize(model: nn.Module, dims: ParallelDims) -> nn.Module:
    """Shard ``model`` (already split into its pipeline stage and on its device) over ``dims.mesh``.

    zero=0: DDP (replicated parameters, gradient all-reduce); with TP the same semantics through
    FSDP2 on a replicate-only mesh. zero 1/2/3: FSDP2 sharding over dp. Returns the module to train:
    the same object for TP/FSDP (sharded in place), a DDP wrapper otherwise; ``unwrap`` undoes that.
    """
    mesh = dims.mesh
    if dims.tp > 1:
        if not isinstance(model, GPT):
            raise TypeError("tensor parallelism needs the built-in GPT (its plan shards by module name)")
        apply_tp(model, mesh["tp"])
    if dims.dp_enabled and dims.zero == 0 and dims.tp > 1:
        # DDP cannot all-reduce DTensor parameters; FSDP2 over (dp, dp_shard=1) replicates instead:
        # the same gradient all-reduce over dp, no sharding.
        apply_fsdp(model, mesh["dp", "dp_shard"], reshard_after_forward=False)
        return model
    if dims.fsdp:
        # zero 1/2 keep parameters gathered from forward to backward (one all-gather per step);
        # zero 3 frees them after forward and gathers again in backward.
        apply_fsdp(model, mesh["dp"], reshard_after_forward=dims.zero == 3 and dims.pp == 1)
        return model
    if dims.dp_enabled:
        return apply_ddp(model, mesh["dp"], pipelined=dims.pp > 1)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DDP) else model


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the data-parallel gradient reduction on all but the last micro-batch."""
    if enabled:
        yield
    elif isinstance(model, DDP):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
