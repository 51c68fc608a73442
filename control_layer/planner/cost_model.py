"""The cost model: FLOPs, memory, communication and sync time as pure formulas.

Every function takes plain numbers (or numpy arrays, so the search can evaluate many clusters at
once) and returns seconds, bytes or USD. docs/cost-model.md states each formula and its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from contracts.job_spec import JobSpec, ModelSpec, SyncSpec, TrainingSpec
from control_layer.planner.plan_types import Calibration

# Fraction of measured TFLOPS a training step achieves when no calibration says otherwise.
DEFAULT_DEVICE_EFFICIENCY = 0.5
# Achieved fraction of nominal bandwidth: WAN streams lose more to TCP and chunking than a LAN.
DEFAULT_WAN_GOODPUT = 0.7
DEFAULT_LAN_GOODPUT = 0.9
# Allocator fragmentation, runtime context and communication buffers take the rest.
USABLE_MEMORY_FRACTION = 0.9
# Cross-region payload before compression: fp32 parameters or pseudo-gradients.
SYNC_BASE_BYTES_PER_PARAM = 4.0
GB = 1e9


def precision_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def sync_bytes_per_param(sync: SyncSpec) -> float:
    """Bytes per parameter on the wire after compression (top-k sends a value and an index)."""
    if sync.compression in ("fp16", "bf16"):
        return 2.0
    if sync.compression == "int8":
        return 1.0
    if sync.compression == "topk":
        return 8.0 * sync.topk_ratio
    return SYNC_BASE_BYTES_PER_PARAM


# ---------------------------------------------------------------- calibration lookups


def device_efficiency(model: str, calibration: Calibration | None) -> float:
    if calibration:
        want = model.lower()
        for key, value in calibration.device_efficiency.items():
            if key.lower() == want:
                return value
    return DEFAULT_DEVICE_EFFICIENCY


def link_goodput(a: str, b: str, calibration: Calibration | None) -> float:
    if calibration:
        for key in (f"{a}|{b}", f"{b}|{a}"):
            if key in calibration.link_goodput:
                return calibration.link_goodput[key]
    return DEFAULT_LAN_GOODPUT if a == b else DEFAULT_WAN_GOODPUT


def bytes_per_s(gbps: float, goodput: float) -> float:
    return gbps * 1e9 / 8.0 * goodput


# ---------------------------------------------------------------- model arithmetic


def flops_per_token(model: ModelSpec, activation_checkpointing: bool) -> float:
    """Training FLOPs per token: 6N for the dense matmuls plus 12·L·s·d for attention scores.

    Recomputing the forward pass under activation checkpointing adds one forward: 8N + 16·L·s·d.
    """
    dense, attn = 6.0, 12.0
    if activation_checkpointing:
        dense, attn = 8.0, 16.0
    return dense * model.n_params + attn * model.n_layers * model.seq_len * model.d_model


def block_params(model: ModelSpec) -> int:
    d = model.d_model
    return 12 * d * d + 13 * d


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    return math.ceil(model.n_layers / pp)


def stage_params(model: ModelSpec, tp: int, pp: int) -> float:
    """Parameters held by one device of the fullest stage.

    The first stage holds the embeddings and the last the tied output head, so the fullest
    stage is ceil(L/pp) blocks plus the embedding table; TP splits all of it tp ways.
    """
    d = model.d_model
    embed = model.vocab * d + model.seq_len * d + 2 * d
    return (layers_per_stage(model, pp) * block_params(model) + embed) / tp


@dataclass(frozen=True)
class Memory:
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits


def in_flight_micro_batches(pp: int, n_micro: int, schedule: str) -> int:
    """Micro-batches whose activations a stage holds at its peak (first stage)."""
    if pp == 1:
        return 1
    return n_micro if schedule == "gpipe" else min(pp, n_micro)


def activation_bytes_per_layer(model: ModelSpec, training: TrainingSpec, tp: int) -> float:
    """Korthikanti et al. (2022), eq. 2 without sequence parallelism: s·b·d·(10 + 24/t + 5·a·s/(d·t)).

    The coefficients count 16-bit tensors; fp32 roughly doubles them. With activation
    checkpointing a layer keeps only its 16-bit input, s·b·d·2 bytes.
    """
    s, b, d, a = model.seq_len, training.micro_batch_size, model.d_model, model.n_heads
    scale = 2.0 if training.precision == "fp32" else 1.0
    if training.activation_checkpointing:
        return s * b * d * 2.0 * scale
    return s * b * d * (10.0 + 24.0 / tp + 5.0 * a * s / (d * tp)) * scale


def memory_per_device(
    spec: JobSpec, tp: int, pp: int, zero: int, shard_group: int, n_micro: int, schedule: str
) -> Memory:
    """Peak bytes on one device of the fullest stage.

    Mixed precision keeps 16-bit weights and gradients and 12 bytes/param of fp32 master weights
    plus Adam moments (Rajbhandari et al. 2020, ZeRO); fp32 keeps 4 + 4 + 8. ZeRO stage k shards
    optimizer state (k ≥ 1), gradients (k ≥ 2) and weights (k = 3) over the shard_group replicas
    of one cluster; ZeRO-3 also holds two gathered layers at a time.
    """
    model, training = spec.model, spec.training
    w = precision_bytes(training.precision)
    p = stage_params(model, tp, pp)
    r = max(1, shard_group)
    weights, grads = p * w, p * w
    optimizer = p * (8.0 if training.precision == "fp32" else 12.0)
    if zero >= 1:
        optimizer /= r
    if zero >= 2:
        grads /= r
    if zero >= 3:
        weights = weights / r + 2.0 * block_params(model) / tp * w
    lps = layers_per_stage(model, pp)
    per_layer = activation_bytes_per_layer(model, training, tp)
    acts = in_flight_micro_batches(pp, n_micro, schedule) * lps * per_layer
    if training.activation_checkpointing:
        # One layer's full activations live while it is recomputed.
        full = model.seq_len * training.micro_batch_size * model.d_model
        full *= 10.0 + 24.0 / tp + 5.0 * model.n_heads * model.seq_len / (model.d_model * tp)
        acts += full * (2.0 if training.precision == "fp32" else 1.0)
    # fp32 logits and their gradient on the last stage (vocab-parallel under TP).
    logits = 2.0 * 4.0 * model.seq_len * training.micro_batch_size * model.vocab / tp
    return Memory(weights, grads, optimizer, acts, logits)


def fits(memory_bytes: float, device_memory_gb: float | np.ndarray) -> bool | np.ndarray:
    return memory_bytes <= USABLE_MEMORY_FRACTION * device_memory_gb * GB


# ---------------------------------------------------------------- per-replica step time


def allreduce_s(n: int, nbytes: float, bw_bytes_per_s, latency_s):
    """Ring all-reduce: 2(n−1)/n of the payload over the slowest link, 2(n−1) latency hops."""
    if n <= 1:
        return 0.0 * bw_bytes_per_s
    return 2.0 * (n - 1) / n * nbytes / bw_bytes_per_s + 2.0 * (n - 1) * latency_s


@dataclass(frozen=True)
class ReplicaTime:
    """Seconds per step of one replica, by part (numpy arrays when evaluated over many clusters)."""

    compute: object
    tp_comm: object
    dp_comm: object
    pp_bubble: object
    pp_comm: object

    @property
    def total(self):
        return self.compute + self.tp_comm + self.dp_comm + self.pp_bubble + self.pp_comm


def replica_time(
    spec: JobSpec,
    tp: int,
    pp: int,
    zero: int,
    n_micro: int,
    shared: bool,
    effective_flops,
    intra_bw,
    intra_lat,
    pp_bw,
    pp_lat,
) -> ReplicaTime:
    """One replica's step on devices of effective_flops (FLOP/s, measured × efficiency).

    intra_bw/intra_lat (bytes/s, s) carry TP and the in-cluster gradient all-reduce; pp_bw/pp_lat
    carry activations between stages. shared: the replica syncs gradients with at least one
    other replica of its cluster every step, bounded by the full ring volume 2·G.
    """
    model, training = spec.model, spec.training
    b, s, d = training.micro_batch_size, model.seq_len, model.d_model
    w = precision_bytes(training.precision)
    lps = layers_per_stage(model, pp)
    fpt = flops_per_token(model, training.activation_checkpointing)
    t_mb = fpt * b * s * (lps / model.n_layers) / tp / effective_flops
    compute = n_micro * t_mb
    bubble = (pp - 1) * t_mb

    if tp > 1:
        per_layer = 6 if training.activation_checkpointing else 4
        act = b * s * d * w
        tp_comm = n_micro * lps * per_layer * allreduce_s(tp, act, intra_bw, intra_lat)
    else:
        tp_comm = 0.0 * t_mb

    if pp > 1:
        hop = pp_lat + b * s * d * w / pp_bw
        # Fill and drain put 2(p−1) hops on the critical path; in steady state a transfer hides
        # behind the opposite pass (a forward is a third of fwd+bwd) unless it is slower.
        pp_comm = 2.0 * (pp - 1) * hop + 2.0 * n_micro * np.maximum(0.0, hop - t_mb / 3.0)
    else:
        pp_comm = 0.0 * t_mb

    if shared:
        grad_bytes = stage_params(model, tp, pp) * w
        volume = 1.5 if zero == 3 else 1.0
        dp_comm = volume * (2.0 * grad_bytes / intra_bw + 2.0 * intra_lat)
    else:
        dp_comm = 0.0 * t_mb
    return ReplicaTime(compute, tp_comm, dp_comm, bubble, pp_comm)


def pp_link_fast_enough(spec: JobSpec, tp: int, pp: int, effective_flops: float, bw, lat) -> bool:
    """A link may carry a stage boundary when one activation transfer hides behind a forward."""
    model, training = spec.model, spec.training
    b, s, d = training.micro_batch_size, model.seq_len, model.d_model
    w = precision_bytes(training.precision)
    lps = layers_per_stage(model, pp)
    t_mb = flops_per_token(model, training.activation_checkpointing) * b * s * (lps / model.n_layers)
    t_mb = t_mb / tp / effective_flops
    return lat + b * s * d * w / bw <= t_mb / 3.0


# ---------------------------------------------------------------- cross-cluster sync


def sync_every(sync: SyncSpec) -> int:
    """Steps between cross-cluster exchanges: every step for sync/ssp/async, H otherwise."""
    return sync.every if sync.mode in ("local_sgd", "diloco", "gossip") else 1


def exchanges_per_step(sync: SyncSpec, steps: int) -> float:
    """Exchanges per step, amortised: ceil(steps/H) rounds, the last one producing the final model."""
    return math.ceil(steps / sync_every(sync)) / steps


def wan_bytes_per_leader(sync: SyncSpec, n_params: float, n_regions) -> np.ndarray:
    """Bytes each region leader sends per exchange among n_regions leaders.

    Dense payloads use a ring all-reduce (2(R−1)/R of the payload); top-k payloads do not stay
    sparse under summation, so they are all-gathered ((R−1) payloads); gossip sends the payload
    to each of min(k, R−1) peers.
    """
    rr = np.asarray(n_regions, dtype=float)
    payload = n_params * sync_bytes_per_param(sync)
    if sync.mode == "gossip":
        out = np.minimum(sync.gossip_peers, rr - 1) * payload
    elif sync.compression == "topk":
        out = (rr - 1) * payload
    else:
        out = 2.0 * (rr - 1) / np.maximum(rr, 1) * payload
    return np.where(rr >= 2, out, 0.0)


def wan_latency_hops(sync: SyncSpec, n_regions) -> np.ndarray:
    rr = np.asarray(n_regions, dtype=float)
    if sync.mode == "gossip":
        hops = np.ones_like(rr)
    elif sync.compression == "topk":
        hops = rr - 1
    else:
        hops = 2.0 * (rr - 1)
    return np.where(rr >= 2, hops, 0.0)


def wan_time_factor(sync: SyncSpec, n_params: float, n_regions) -> np.ndarray:
    """Seconds-per-(byte/s) coefficient of the WAN phase: bytes that cross the bottleneck link.

    Gossip exchanges with each peer on its own link concurrently, so one payload crosses the
    slowest link; the ring and the all-gather serialise their bytes through every leader.
    """
    rr = np.asarray(n_regions, dtype=float)
    if sync.mode == "gossip":
        per = np.full_like(rr, n_params * sync_bytes_per_param(sync))
        return np.where(rr >= 2, per, 0.0)
    return wan_bytes_per_leader(sync, n_params, rr)


def local_sync_s(sync: SyncSpec, n_params: float, bw, lat):
    """Reduce and broadcast through a region leader over the regional fabric (bound: 2 payloads)."""
    return 2.0 * n_params * sync_bytes_per_param(sync) / bw + 2.0 * lat


def sync_overlapped(sync: SyncSpec) -> bool:
    """Whether the exchange runs concurrently with local compute.

    DiLoCo applies the outer update one round late so the exchange overlaps the next H inner
    steps; SSP with staleness ≥ 1 and async overlap per-step traffic; sync, local SGD and gossip
    rounds stop the replicas while they exchange.
    """
    if sync.mode == "diloco" or sync.mode == "async":
        return True
    return sync.mode == "ssp" and sync.staleness >= 1


def wan_sync_per_step(sync: SyncSpec, steps: int, t_sync, t_local):
    """Seconds the exchange adds to an average step."""
    per = t_sync * exchanges_per_step(sync, steps)
    if sync_overlapped(sync):
        return np.maximum(0.0, per - t_local)
    return per
