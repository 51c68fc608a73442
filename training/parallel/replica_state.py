"""The whole replica's parameters, gathered on the cluster leader and written back from it.

A replica is spread over the cluster: TP and FSDP shard each tensor (DTensor), PP puts different
layers on different stages. The cross-region engine wants one full tensor per parameter on the
leader (global rank 0), in one agreed order, and its result put back into every shard.

The order ("layout") is stage by stage, each stage in its module's ``named_parameters`` order; for
the GPT that is exactly the unsplit model's order. It is computed once per model with one
``all_gather_object`` and cached.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from training.parallel.dims import ParallelDims
from training.parallel.parallelize import unwrap


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stage: int


_layouts: weakref.WeakKeyDictionary[nn.Module, list[ParamInfo]] = weakref.WeakKeyDictionary()


def replica_layout(model: nn.Module, dims: ParallelDims) -> list[ParamInfo]:
    """Every parameter of the replica, in canonical order (collective on first call per model)."""
    inner = unwrap(model)
    if inner in _layouts:
        return _layouts[inner]
    mine = [(n, tuple(p.shape), p.dtype) for n, p in inner.named_parameters()]  # DTensor shape is global
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (dims.pp_rank, mine))
    layout = []
    for stage in range(dims.pp):
        _, params = everyone[dims.stage_leader(stage)]  # type: ignore[misc]
        layout += [ParamInfo(n, s, d, stage) for n, s, d in params]
    _layouts[inner] = layout
    return layout


def full_param_names(model: nn.Module, dims: ParallelDims) -> list[str]:
    return [p.name for p in replica_layout(model, dims)]


def _grads(model: nn.Module) -> dict[str, Tensor]:
    """Each parameter's gradient (zeros where backward left none), sharded like the parameter."""
    out = {}
    for n, p in unwrap(model).named_parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        out[n] = p.grad
    return out


@torch.no_grad()
def gather_full_grads(model: nn.Module, dims: ParallelDims) -> list[Tensor]:
    """``gather_full_params`` for the gradients (after the cluster's data-parallel reduction)."""
    return gather_full_params(model, dims, _grads(model))


@torch.no_grad()
def scatter_full_grads(model: nn.Module, dims: ParallelDims, tensors: list[Tensor]) -> None:
    """``scatter_full_params`` for the gradients: the leader's values replace every rank's."""
    scatter_full_params(model, dims, tensors, _grads(model))


@torch.no_grad()
def gather_full_params(
    model: nn.Module, dims: ParallelDims, tensors: dict[str, Tensor] | None = None
) -> list[Tensor]:
    """Collective on all ranks. Leader: fresh contiguous CPU tensors, one per parameter of the
    replica in ``replica_layout`` order. Other ranks: ``[]``. ``tensors`` (name -> tensor shaped
    and sharded like the parameter) gathers those instead of the parameters."""
    layout = replica_layout(model, dims)
    local = tensors if tensors is not None else dict(unwrap(model).named_parameters())
    rank, my_stage = dist.get_rank(), dims.pp_rank
    device = next(iter(local.values())).device
    out: list[Tensor] = []
    for info in layout:
        leader = dims.stage_leader(info.stage)
        if info.stage == my_stage:
            p = local[info.name]
            full = p.full_tensor() if isinstance(p, DTensor) else p.detach()  # collective within the stage
            if rank == 0:
                out.append(full.to("cpu", copy=True).contiguous())
            elif rank == leader:
                dist.send(full.contiguous(), dst=0)
        elif rank == 0:
            buf = torch.empty(info.shape, dtype=info.dtype, device=device)
            dist.recv(buf, src=leader)
            out.append(buf.cpu())
    return out


@torch.no_grad()
def scatter_full_params(
    model: nn.Module, dims: ParallelDims, tensors: list[Tensor], targets: dict[str, Tensor] | None = None
) -> None:
    """Collective on all ranks: the leader's ``tensors`` (``replica_layout`` order) overwrite every
    rank's parameters or parameter shards (or ``targets``, shaped and sharded like them).
    ``tensors`` is ignored off the leader."""
    layout = replica_layout(model, dims)
    local = targets if targets is not None else dict(unwrap(model).named_parameters())
    rank, my_stage = dist.get_rank(), dims.pp_rank
    device = next(iter(local.values())).device
    if rank == 0 and len(tensors) != len(layout):
        raise ValueError(f"scatter_full_params got {len(tensors)} tensors for {len(layout)} parameters")
    for i, info in enumerate(layout):
        if rank == 0:
            src = tensors[i]
            if tuple(src.shape) != info.shape:
                raise ValueError(f"{info.name}: got shape {tuple(src.shape)}, expected {info.shape}")
            buf = src.to(device=device, dtype=info.dtype).contiguous()
        else:
            buf = torch.empty(info.shape, dtype=info.dtype, device=device)
        dist.broadcast(buf, src=0)
        if info.stage != my_stage:
            continue
        p = local[info.name]
        if isinstance(p, DTensor):
            # Every rank holds the full tensor, so each cuts its own shard without communication.
            shard = distribute_tensor(buf, p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(shard.to_local())
        else:
            p.copy_(buf)
