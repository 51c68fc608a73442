"""What the runtime can execute: one set of rules for the planner, the control plane and the worker.

The planner enumerates only degrees and placements these rules allow; the control plane checks a
chosen option against them before it writes worker configs; the worker's config validation applies
the ones it can see. Each function returns the problems it finds, as sentences naming the field,
so every caller reports the same reason. Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Literal

Precision = Literal["bf16", "fp32"]

# What a bring-your-own model can be given: the runtime replicates any nn.Module (DDP) and shards
# any nn.Module (FSDP2, ZeRO 1-3); TP and PP shard the built-in GPT by its module names.
BYO_PARALLELISM = ("dp", "zero")
BYO_DEFAULT_PARALLELISM = ("dp",)


def resolve_precision(requested: str, device_kinds: Iterable[str]) -> Precision:
    """The precision a placement trains at: 'auto' is bf16 only when every device is CUDA.

    CPUs without native bf16 run autocast far slower than fp32 (8x on the reference box), while
    CUDA devices are measured, and train fastest, in bf16.
    """
    if requested in ("bf16", "fp32"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"unknown precision {requested!r}")
    kinds = set(device_kinds)
    return "bf16" if kinds and kinds == {"cuda"} else "fp32"


def shape_problems(
    *, n_heads: int, n_layers: int, d_model: int, mlp_ratio: int = 4, tp: int, pp: int
) -> list[str]:
    """The model must split over the degrees: heads and MLP over tp, at least a layer per stage."""
    out = []
    if n_heads % tp:
        out.append(f"model.n_heads ({n_heads}) must be divisible by tp ({tp})")
    if (mlp_ratio * d_model) % tp:
        out.append(f"MLP width ({mlp_ratio * d_model}) must be divisible by tp ({tp})")
    if n_layers < pp:
        out.append(f"model.n_layers ({n_layers}) must be >= pp ({pp}): each stage needs a layer")
    return out


def batch_problems(*, global_batch: int, dp: int, micro_batch: int, pp: int) -> list[str]:
    """Sequences per step must split over the replicas, then into micro-batches; a pipeline needs at
    least pp micro-batches to fill (the worker runs local_batch / micro_batch of them)."""
    if global_batch % dp:
        return [f"the global batch of {global_batch} sequences does not split over {dp} replicas"]
    local = global_batch // dp
    if local % micro_batch:
        return [f"the local batch of {local} sequences does not split into micro-batches of {micro_batch}"]
    if pp > 1 and local // micro_batch < pp:
        return [
            f"{local // micro_batch} micro-batches per replica cannot fill a {pp}-stage pipeline"
            f" (local batch {local}, micro-batch {micro_batch})"
        ]
    return []


def byo_problems(
    *,
    entrypoint: bool,
    supports: Collection[str],
    tp: int,
    pp: int,
    zero: int,
    activation_checkpointing: bool = False,
) -> list[str]:
    """A bring-your-own model gets data parallelism, and ZeRO/FSDP sharding when it says it supports
    it; activation checkpointing needs the built-in GPT's blocks (a BYO model does its own)."""
    if not entrypoint:
        return []
    out = []
    if activation_checkpointing:
        out.append(
            "activation_checkpointing applies to the built-in GPT only; a bring-your-own model"
            " checkpoints its own activations (torch.utils.checkpoint) if it wants to"
        )
    if tp > 1 or pp > 1:
        out.append(
            f"a bring-your-own model runs with tp = pp = 1 (got tp={tp}, pp={pp}):"
            " tensor and pipeline parallelism need the built-in GPT's module structure"
        )
    if zero > 0 and "zero" not in supports:
        out.append(f"zero={zero} needs 'zero' in entrypoint_parallelism (it has {sorted(supports)})")
    return out


def byo_parallelism_problems(values: Collection[str]) -> list[str]:
    """The values a job may declare for its entrypoint."""
    out = [
        f"{v!r} is not available to a bring-your-own model (allowed: {', '.join(BYO_PARALLELISM)});"
        " tensor and pipeline parallelism need the built-in GPT's module structure"
        for v in values
        if v not in BYO_PARALLELISM
    ]
    if "dp" not in values:
        out.append("'dp' is required: every model is replicated across clusters")
    return out


def data_region_problems(data_region: str | None, task_regions: Iterable[str]) -> list[str]:
    """Data pinned to a region is read only there."""
    if data_region is None:
        return []
    return [
        f"data.region is {data_region!r} but the plan puts a task in {r!r}"
        for r in sorted(set(task_regions))
        if r != data_region
    ]


def sync_port_problems(n_tasks: int, nodes_without_port: Collection[str]) -> list[str]:
    """With several tasks every task's leader listens for its peers, so each node needs a sync port."""
    if n_tasks > 1 and nodes_without_port:
        return [
            f"nodes {sorted(nodes_without_port)} have no sync port; a job spanning several nodes needs one"
            " per node"
        ]
    return []


# Modes whose exchange is elementwise over the parameters and dense (a ring or all-to-all of every
# element): each pipeline stage can reduce its own parameters in a ring of its own, the stages'
# rings side by side. The others (ssp, async, gossip) keep one leader per participant, which gathers
# the whole replica (their protocols pair whole models: a server's answer, a gossip partner's
# weights, a staleness bound per participant).
STAGE_SYNC_MODES = ("sync", "local_sgd", "diloco")


def syncs_per_stage(*, mode: str, participants: int, pp: int, stage_leaders_split: bool) -> bool:
    """Whether a job's participants sync per pipeline stage: a dense mode, two or more participants,
    and some participant whose stage leaders sit on different nodes (a whole replica's gradients
    would otherwise cross its own nodes' fabric to one leader and leave through one port)."""
    return mode in STAGE_SYNC_MODES and participants > 1 and pp > 1 and stage_leaders_split


def stage_sync_problems(*, mode: str, pp: int, stages: Collection[int]) -> list[str]:
    """Per-stage rings: one per stage, only in the modes that run them."""
    if not stages:
        return []
    out = []
    if mode not in STAGE_SYNC_MODES:
        out.append(
            f"sync.stages: mode {mode!r} syncs through one leader per participant; per-stage rings"
            f" run in modes {', '.join(STAGE_SYNC_MODES)} only"
        )
    if sorted(stages) != list(range(pp)):
        out.append(f"sync.stages must list each of the {pp} pipeline stages once, got {sorted(stages)}")
    return out
