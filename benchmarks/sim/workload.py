"""What one pipeline stage computes and moves, counted from the model the worker builds.

The worker's GPT (``training.models.gpt``, sizes in ``contracts.model``): per block, q/k/v/proj
(d x d, with biases), an MLP d -> r·d -> d (with biases), two LayerNorms; token and position
embeddings on the first stage; the final norm and an untied ``lm_head`` (d x V, no bias) on the
last (``training.parallel.pipeline.split_stage``: contiguous layer ranges, earlier stages take the
remainder).

FLOPs (a multiply-add is 2): forward per token of one block = 2 x its matmul weights (4d² + 2r·d²)
+ attention scores and weighted values 2 x 2·s·d (the full s x s product; Kaplan et al. 2020
table 1 counts the same); the head 2·d·V; embeddings are lookups. Backward = 2 x forward (one
product for input gradients, one for weight gradients). Activation checkpointing reruns each
block's forward in backward; the head is not checkpointed.

Tensor parallelism (``training.parallel.parallelize.apply_tp``): q/k/v/fc column-parallel and both
output projections row-parallel, so a rank holds 1/tp of the block matmuls and heads; norms,
row-parallel biases, embeddings and the head stay replicated (each rank computes the whole head).
One all-reduce of the block output per attention and per MLP in forward, and one each in
backward (Shoeybi et al. 2019, §3), of b·s·d values in the matmul dtype.

Bytes on the wire: ``training.precision`` bf16 autocasts matmuls to bf16 while weights stay fp32,
so TP all-reduces carry bf16 (Linear outputs) but the residual stream passed between pipeline
stages is fp32 (fp32 embeddings plus bf16 branches promote to fp32), and gradients, reduced
across replicas in the parameters' dtype, are fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.job_spec import JobSpec
from contracts.model import model_config


def stage_layers(n_layers: int, pp: int) -> list[int]:
    base, extra = divmod(n_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


@dataclass(frozen=True)
class StageWork:
    fwd_flops: float  # per micro-batch, on one tp rank
    bwd_flops: float  # per micro-batch, on one tp rank, recompute included
    tp_allreduces_fwd: int  # per micro-batch
    tp_allreduces_bwd: int
    grad_bytes: float  # gradients one tp rank of this stage reduces across replicas


@dataclass(frozen=True)
class Workload:
    stages: list[StageWork]
    tp_bytes: float  # one TP all-reduce payload
    activation_bytes: float  # one stage-to-stage transfer (forward activation or its gradient)
    n_params: int
    stage_params: list[int]  # every tp rank's share of each stage together: what its own sync ring moves


def workload(spec: JobSpec, pp: int, tp: int, micro_batch: int) -> Workload:
    cfg = model_config(spec.model)
    d, s, v, r = cfg.d_model, cfg.seq_len, cfg.vocab, cfg.mlp_ratio
    tokens = micro_batch * s
    bf16 = spec.training.precision == "bf16"
    ckpt = spec.training.activation_checkpointing

    block_fwd = tokens * (2 * (4 * d * d + 2 * r * d * d) + 4 * s * d) / tp
    head_fwd = tokens * 2 * d * v
    block_sharded = 4 * d * d + 3 * d + 2 * r * d * d + r * d  # q/k/v/fc weights+biases, proj weights
    block_replicated = 6 * d  # two LayerNorms, two row-parallel biases
    block_params = block_sharded / tp + block_replicated

    stages, whole = [], []
    layers = stage_layers(cfg.n_layers, pp)
    for i, n in enumerate(layers):
        first, last = i == 0, i == pp - 1
        fwd = n * block_fwd + (head_fwd if last else 0.0)
        bwd = 2 * fwd + (n * block_fwd if ckpt else 0.0)
        params = n * block_params + (v * d + s * d if first else 0) + (2 * d + d * v if last else 0)
        ar = 2 * n if tp > 1 else 0
        stages.append(StageWork(fwd, bwd, ar, ar * (2 if ckpt else 1), params * 4.0))
        extras = (v * d + s * d if first else 0) + (2 * d + d * v if last else 0)
        whole.append(n * (block_sharded + block_replicated) + extras)
    n_params = sum(n for n in layers) * (block_sharded + block_replicated) + v * d + s * d + 2 * d + d * v
    return Workload(
        stages=stages,
        tp_bytes=tokens * d * (2.0 if bf16 else 4.0),
        activation_bytes=tokens * d * 4.0,
        n_params=n_params,
        stage_params=whole,
    )
