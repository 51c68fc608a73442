"""What one device holds of a job's parameters, by the unit FSDP2 gathers them in.

Follows the worker's split (``training.parallel``): contiguous layers per pipeline stage, the
embeddings on the first and the final norm and lm_head on the last, tensor parallelism by
``contracts.model.TP_PLAN`` (embeddings, norms and the lm_head stay whole on every tp rank), and
FSDP2's sharding of each tensor's first dimension in equal, padded chunks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

from contracts.model import TP_PLAN, GPTConfig, gpt_param_shapes, tp_local_shape

FP32, BF16, TOKEN_ID = 4, 2, 8  # bytes: fp32 values, bf16 values, int64 token ids


@dataclass(frozen=True)
class Layout:
    """A replica's shape on its devices: ``shard_group`` replicas share a torchrun group (DDP
    or FSDP over them), ``n_micro`` micro-batches of ``micro_batch`` sequences a step (gradient
    accumulation, or the pipeline's micro-batches under ``schedule``)."""

    tp: int = 1
    pp: int = 1
    zero: int = 0
    shard_group: int = 1
    n_micro: int = 1
    micro_batch: int = 1
    precision: str = "fp32"
    activation_checkpointing: bool = False
    schedule: str = "1f1b"

    @property
    def fsdp(self) -> bool:
        """FSDP2 wraps the model (``parallelize``): ZeRO 1-3, and replicas with TP (DDP cannot
        reduce DTensors, so FSDP2 replicates over a shard group of one)."""
        return self.zero >= 1 or (self.tp > 1 and self.shard_group > 1)

    @property
    def ddp(self) -> bool:
        return not self.fsdp and self.shard_group > 1

    @property
    def shards(self) -> int:
        """How many ways FSDP2 shards each parameter (1: it keeps a whole copy apart)."""
        return self.shard_group if self.zero >= 1 else 1

    @property
    def reshard_after_forward(self) -> bool:
        """ZeRO-3 frees a block's gathered parameters after its forward (outside a pipeline,
        whose stages run several forwards before a backward)."""
        return self.zero == 3 and self.pp == 1


@dataclass(frozen=True)
class Unit:
    """What FSDP2 gathers as one: a block, or the stage's other parameters (its root). Counts are
    parameter values on one tp rank."""

    local: int  # values the tp rank holds
    shard: int  # of them, its FSDP shard, padded as FSDP2 pads it (dim 0 in equal chunks)
    matmul: int  # values of the Linear weights (autocast's bf16 copies)
    bias: int = 0  # values of the Linear biases (autocast's bf16 copies too)
    tensors: int = 0  # parameter tensors (AdamW keeps a step counter for each)


def stage_layers(n_layers: int, pp: int, stage: int) -> range:
    """The worker's split (``training.parallel.pipeline``): contiguous, earlier stages taking
    the remainder."""
    base, extra = divmod(n_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


@dataclass(frozen=True)
class StageParams:
    """A stage's parameters on one device: FSDP2's units (the embeddings and the head make one,
    the root; each block is one) and the optimizer's order of them."""

    embed: Unit
    head: Unit
    blocks: tuple[Unit, ...]
    optimizer_temp: int  # values of AdamW's largest temporaries at once (``_optimizer_temp``)

    @functools.cached_property
    def root(self) -> Unit:
        """The embeddings and the head as one unit: their counts add up."""
        e, h = self.embed, self.head
        return Unit(**{f.name: getattr(e, f.name) + getattr(h, f.name) for f in fields(Unit)})

    @property
    def units(self) -> tuple[Unit, ...]:
        return (self.root, *self.blocks)


@functools.lru_cache(maxsize=4096)
def stage_params(cfg: GPTConfig, tp: int, pp: int, shards: int, stage: int) -> StageParams:
    """The parameters of pipeline stage ``stage`` one device holds, by unit, FSDP2 sharding
    each over ``shards`` devices (1: whole)."""
    keep = stage_layers(cfg.n_layers, pp, stage)
    first, last = stage == 0, stage == pp - 1
    embed: list[tuple[str, tuple[int, ...]]] = []
    head: list[tuple[str, tuple[int, ...]]] = []
    blocks: dict[int, list[tuple[str, tuple[int, ...]]]] = {i: [] for i in keep}
    order: list[tuple[str, tuple[int, ...]]] = []
    for name, shape in gpt_param_shapes(cfg).items():
        part = name.split(".")[0]
        local = tp_local_shape(name, shape, tp)
        if part == "layers" and int(name.split(".")[1]) in blocks:
            blocks[int(name.split(".")[1])].append((name, local))
        elif part in ("tok_emb", "pos_emb") and first:
            embed.append((name, local))
        elif part in ("norm", "lm_head") and last:
            head.append((name, local))
        else:
            continue
        order.append((name, local))
    return StageParams(
        _unit(embed, shards),
        _unit(head, shards),
        tuple(_unit(blocks[i], shards) for i in keep),
        _optimizer_temp([shape for _, shape in order], shards),
    )


def _optimizer_temp(shapes: list[tuple[int, ...]], shards: int) -> int:
    """AdamW one tensor at a time (``training.step.build_optimizer``): for each parameter it
    makes sqrt(v) and divides it into a new tensor while the previous parameter's divisor is
    still referenced, so 2 of this tensor and 1 of the one before are held at once. Matrices
    (weight decay) and vectors form separate groups, each stepped in its own call."""
    temp = 0
    for group in ([s for s in shapes if len(s) >= 2], [s for s in shapes if len(s) < 2]):
        sizes = [-(-s[0] // shards) * math.prod(s[1:]) for s in group]
        for i, n in enumerate(sizes):
            temp = max(temp, 2 * n + (sizes[i - 1] if i else 0))
    return temp


def _unit(params: list[tuple[str, tuple[int, ...]]], shards: int) -> Unit:
    local = [math.prod(shape) for _, shape in params]
    padded = [-(-shape[0] // shards) * math.prod(shape[1:]) for _, shape in params]

    def values(kind: str) -> list[int]:
        names = {f"{module}.{kind}" for module in (*TP_PLAN, "lm_head")}
        return [n for (name, _), n in zip(params, local, strict=True) if _in_block(name) in names]

    return Unit(sum(local), sum(padded), sum(values("weight")), sum(values("bias")), len(params))


def _in_block(name: str) -> str:
    """A parameter's name inside its block ("layers.3.attn.q.weight" -> "attn.q.weight")."""
    return name.split(".", 2)[2] if name.startswith("layers.") else name
