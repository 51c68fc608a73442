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
        _copy_full(local[info.name], buf)


# Per-stage sync (``training.sync.stages``): each stage's leader holds only its own stage's tensors.


def stage_layout(model: nn.Module, dims: ParallelDims, stage: int) -> list[ParamInfo]:
    """The parameters of pipeline stage ``stage``, in ``replica_layout`` order."""
    return [i for i in replica_layout(model, dims) if i.stage == stage]


def stage_groups(dims: ParallelDims) -> list[dist.ProcessGroup | None]:
    """Collective on all ranks (every rank creates every group, in stage order): per stage, the
    process group of its ranks (replicas x tensor shards), None where the stage is one rank."""
    per_stage = dims.dp * dims.tp
    groups: list[dist.ProcessGroup | None] = []
    for stage in range(dims.pp):
        ranks = list(range(stage * per_stage, (stage + 1) * per_stage))
        groups.append(dist.new_group(ranks) if per_stage > 1 else None)
    return groups


@torch.no_grad()
def gather_stage_params(
    model: nn.Module, dims: ParallelDims, tensors: dict[str, Tensor] | None = None
) -> list[Tensor]:
    """Collective on the ranks of this rank's stage. The stage's leader: fresh contiguous CPU
    tensors, one per parameter of its stage (``stage_layout`` order); other ranks ``[]``."""
    local = tensors if tensors is not None else dict(unwrap(model).named_parameters())
    leads = dist.get_rank() == dims.stage_leader(dims.pp_rank)
    out: list[Tensor] = []
    for info in stage_layout(model, dims, dims.pp_rank):
        p = local[info.name]
        full = p.full_tensor() if isinstance(p, DTensor) else p.detach()  # collective within the stage
        if leads:
            out.append(full.to("cpu", copy=True).contiguous())
    return out


@torch.no_grad()
def scatter_stage_params(
    model: nn.Module,
    dims: ParallelDims,
    tensors: list[Tensor],
    group: dist.ProcessGroup | None,
    targets: dict[str, Tensor] | None = None,
) -> None:
    """Collective on the ranks of this rank's stage (``group``, ``stage_groups``): the stage
    leader's ``tensors`` overwrite the stage's parameters or shards (or ``targets``)."""
    local = targets if targets is not None else dict(unwrap(model).named_parameters())
    leader = dims.stage_leader(dims.pp_rank)
    leads = dist.get_rank() == leader
    layout = stage_layout(model, dims, dims.pp_rank)
    device = next(iter(local.values())).device
    if leads and len(tensors) != len(layout):
        raise ValueError(f"scatter_stage_params got {len(tensors)} tensors for {len(layout)} parameters")
    for i, info in enumerate(layout):
        if leads:
            buf = tensors[i].to(device=device, dtype=info.dtype).contiguous()
        else:
            buf = torch.empty(info.shape, dtype=info.dtype, device=device)
        if group is not None:
            dist.broadcast(buf, src=leader, group=group)
        _copy_full(local[info.name], buf)


@torch.no_grad()
def gather_stage_grads(model: nn.Module, dims: ParallelDims) -> list[Tensor]:
    return gather_stage_params(model, dims, _grads(model))


@torch.no_grad()
def scatter_stage_grads(
    model: nn.Module, dims: ParallelDims, tensors: list[Tensor], group: dist.ProcessGroup | None
) -> None:
    scatter_stage_params(model, dims, tensors, group, _grads(model))


def _copy_full(p: Tensor, buf: Tensor) -> None:
    """Write the full tensor ``buf`` into ``p``, this rank's shard of it where ``p`` is sharded."""
    if isinstance(p, DTensor):
        # Every rank holds the full tensor, so each cuts its own shard without communication.
        shard = distribute_tensor(buf, p.device_mesh, p.placements, src_data_rank=None)
        p.to_local().copy_(shard.to_local())
    else:
        p.copy_(buf)
