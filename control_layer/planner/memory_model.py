"""The one memory rule: what one device of a training job holds, as the worker builds and steps it.

Pure: the model, the training settings and the replica's layout in, bytes out. Parameters,
gradients and optimizer state follow the worker's own layout (``memory_params``: the pipeline
split, tensor parallelism by ``contracts.model.TP_PLAN`` with the embeddings, norms and lm_head
whole on every tp rank, FSDP2's padded shards, DDP's buckets); a step's peak comes from walking
it as the worker runs it (``memory_walk``). The planner prices memory with this alone;
docs/cost-model.md ("Memory") states each term, and ``benchmarks/memory_fit.py`` checks them
against torch's MemTracker on the worker's own code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from contracts.model import GPTConfig
from control_layer.planner.memory_params import FP32, Layout, stage_params
from control_layer.planner.memory_walk import local_step, pipeline_step

__all__ = ["Layout", "Memory", "device_memory", "stage_memory"]


@dataclass(frozen=True)
class Memory:
    """Bytes on one device of one pipeline stage.

    Between steps it keeps ``weights`` (its parameters, or its FSDP shard of them), ``optimizer``
    (AdamW's two moments and step counters) and ``buffers`` (DDP's gradient buckets, a pipeline
    stage's receive buffers). ``grads`` is what it holds in gradients when the optimizer steps;
    ``activations`` what a step holds at its peak beyond what stays between steps (saved
    activations, the loss's logits, FSDP's gathered parameters, the gradients produced so far,
    temporaries), of which ``logits`` is the loss's part at that moment."""

    weights: float
    optimizer: float
    buffers: float
    grads: float
    activations: float
    logits: float = 0.0

    @property
    def between_steps(self) -> float:
        return self.weights + self.optimizer + self.buffers

    @property
    def total(self) -> float:
        """The peak of a step."""
        return self.between_steps + self.activations


@functools.lru_cache(maxsize=16384)
def stage_memory(cfg: GPTConfig, layout: Layout, stage: int) -> Memory:
    """What one device of pipeline stage ``stage`` holds."""
    sp = stage_params(cfg, layout.tp, layout.pp, layout.shards, stage)
    kept = FP32 * sum(u.shard if layout.fsdp else u.local for u in sp.units)
    buffers = FP32 * sum(u.local for u in sp.units) if layout.ddp else 0.0  # DDP's buckets
    # A pipeline stage's receive buffers, one per micro-batch: activations from the stage before,
    # gradients from the stage after.
    neighbours = (stage > 0) + (stage < layout.pp - 1)
    buffers += neighbours * layout.n_micro * FP32 * layout.micro_batch * cfg.seq_len * cfg.d_model
    walk = local_step(cfg, layout, sp) if layout.pp == 1 else pipeline_step(cfg, layout, sp, stage)
    return Memory(
        weights=kept,
        # AdamW's two moments, and its step counter per tensor (on the host under CUDA: small).
        optimizer=2 * kept + FP32 * sum(u.tensors for u in sp.units),
        buffers=buffers,
        grads=kept,
        activations=walk.peak,
        logits=walk.logits_at_peak,
    )


def device_memory(cfg: GPTConfig, layout: Layout) -> Memory:
    """The fullest device of a replica: the stage whose peak is highest."""
    return max((stage_memory(cfg, layout, s) for s in range(layout.pp)), key=lambda m: m.total)
