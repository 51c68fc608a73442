"""The cost model: FLOPs, memory, communication and sync time as pure formulas.

Every function takes plain numbers (or numpy arrays, so the search can evaluate many clusters at
once) and returns seconds, bytes or USD. docs/cost-model.md states each formula and its source.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from contracts.job_spec import JobSpec, ModelSpec, SyncSpec
from contracts.model import gpt_block_param_count, matmul_param_count, model_config, train_flops_per_token
from control_layer.planner.checkpoint_policy import CHECKPOINT_FIXED_S
from control_layer.planner.memory_model import Layout, Memory, device_memory
from control_layer.planner.memory_params import stage_params as stage_params_of
from control_layer.planner.plan_types import Calibration
from control_layer.planner.sync_settings import payload_bytes

# Fraction of measured TFLOPS a training step achieves when no calibration says otherwise.
DEFAULT_DEVICE_EFFICIENCY = 0.5
# Achieved fraction of nominal bandwidth: WAN streams lose more to TCP and chunking than a LAN.
DEFAULT_WAN_GOODPUT = 0.7
# A measured link's figure is already what one gRPC stream achieved (resource_layer.link_probes):
# discounting it again as if it were nominal would price the WAN 30 % slow.
MEASURED_WAN_GOODPUT = 1.0
DEFAULT_LAN_GOODPUT = 0.9
# Allocator fragmentation, runtime context and communication buffers take the rest.
USABLE_MEMORY_FRACTION = 0.9
# Cross-region payload before compression: fp32 parameters or pseudo-gradients.
SYNC_BASE_BYTES_PER_PARAM = 4.0
GB = 1e9
# Bytes of a gradient value: the worker keeps fp32 gradients at either precision (what the
# data-parallel reduction moves).
GRAD_BYTES = 4.0
# The residual stream between blocks stays fp32 under autocast (a bf16 branch added to an fp32
# input), so pipeline hops and checkpointed block inputs are 4 bytes a value.
RESIDUAL_BYTES = 4.0
# Measured TFLOPS are at the device's native training precision (agent/devices.py): bf16 matmuls
# on CUDA, fp32 on CPU. Running the other precision changes the rate by these factors: a CPU
# without native bf16 runs autocast 8x slower (measured on the reference box); fp32 on CUDA
# without TF32 runs on the CUDA cores, about 1/16 of bf16 tensor-core rate (A100: 19.5 vs 312).
OFF_PRECISION_RATE = {("cpu", "bf16"): 1.0 / 8.0, ("cuda", "fp32"): 1.0 / 16.0}


def activation_bytes(precision: str) -> float:
    """Bytes per activation value: autocast's matmul outputs are bf16."""
    _resolved(precision)
    return 2.0 if precision == "bf16" else 4.0


def _resolved(precision: str) -> None:
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"the cost model prices a resolved precision, got {precision!r}")


def precision_rate(kind: str, precision: str) -> float:
    """Fraction of the measured TFLOPS a device of this kind reaches at this precision."""
    _resolved(precision)
    return OFF_PRECISION_RATE.get((kind, precision), 1.0)


def _chosen(sync: SyncSpec, field: str) -> SyncSpec:
    """The cost model prices concrete settings: "auto" is the planner's to resolve first
    (``sync_choice.provisional``), never priced as some default."""
    if field in sync.chosen_by_planner:
        raise ValueError(f"sync.{field} is 'auto': the planner resolves it before pricing")
    return sync


def sync_bytes_per_param(sync: SyncSpec) -> float:
    """Bytes per parameter on the wire after compression (top-k sends a value and an index)."""
    _chosen(sync, "compression")
    return payload_bytes(1, sync.compression, sync.topk_ratio)


# ---------------------------------------------------------------- calibration lookups


def device_efficiency(
    model: str,
    calibration: Calibration | None,
    precision: str | None = None,
    default: float = DEFAULT_DEVICE_EFFICIENCY,
) -> float:
    """Calibrated efficiency for "model|precision", else for "model", else ``default``."""
    if calibration:
        table = {key.lower(): value for key, value in calibration.device_efficiency.items()}
        for want in ([f"{model}|{precision}".lower()] if precision else []) + [model.lower()]:
            if want in table:
                return table[want]
    return default


def effective_flops(
    tflops: float, model: str, kind: str, precision: str, calibration: Calibration | None
) -> float:
    """FLOP/s a device achieves in training: measured TFLOPS × efficiency × the precision's rate."""
    return tflops * 1e12 * device_efficiency(model, calibration, precision) * precision_rate(kind, precision)


# A node that measured nothing: a worker's start (interpreter, `import torch`, rendezvous, model
# build) and its exit still cost seconds, about this much on a small CPU host.
DEFAULT_STARTUP_S = 8.0
DEFAULT_TEARDOWN_S = 1.0


def startup_parts(
    node: str, measured: float | None, measured_launcher: float, calibration: Calibration | None
) -> tuple[float, float]:
    """(launcher, workers): seconds a node takes to start a job on an idle host, in the launcher's
    part (torchrun's interpreter and imports, one process per node, before any worker exists)
    and the workers' (their interpreter, imports, rendezvous and model build, one per slot). Each
    calibrated from finished runs, else as the node measured it at registration (``measured`` the
    whole, ``measured_launcher`` its launcher's part, 0 where not measured), else the default."""
    known = calibration is not None and node in calibration.launcher_s
    launcher = calibration.launcher_s[node] if known and calibration else measured_launcher
    if calibration and node in calibration.startup_s:
        return launcher, calibration.startup_s[node]
    total = DEFAULT_STARTUP_S if measured is None else measured
    return launcher, max(0.0, total - measured_launcher)


def startup_seconds(
    node: str, measured: float | None, calibration: Calibration | None, measured_launcher: float = 0.0
) -> float:
    """Seconds a node takes to start a job on an idle host, both parts (``startup_parts``)."""
    return sum(startup_parts(node, measured, measured_launcher, calibration))


def teardown_seconds(node: str, measured: float | None, calibration: Calibration | None) -> float:
    """Seconds from a worker's result to its process group gone, as for ``startup_seconds``."""
    if calibration and node in calibration.teardown_s:
        return calibration.teardown_s[node]
    return DEFAULT_TEARDOWN_S if measured is None else measured


# One checkpoint write's fixed seconds per idle core, whatever the model's size, until runs
# calibrate it per node: the runtime's own figure (the reference step's write is timed on one
# model only, so its seconds per parameter miss it).
DEFAULT_CHECKPOINT_FIXED_S = CHECKPOINT_FIXED_S


def checkpoint_fixed_seconds(node: str, calibration: Calibration | None) -> float:
    """Seconds one checkpoint write costs on ``node`` beyond its bytes, per idle core."""
    if calibration and node in calibration.checkpoint_fixed_s:
        return calibration.checkpoint_fixed_s[node]
    return DEFAULT_CHECKPOINT_FIXED_S


def host_share(slots_used: float, physical_cores: int) -> float:
    """How many times slower a one-thread CPU slot runs when ``slots_used`` slots share the host's
    cores: declared slots beyond its physical cores take turns (1 when the cores are unknown)."""
    if physical_cores <= 0:
        return 1.0
    return max(1.0, slots_used / physical_cores)


def checkpoint_writes(steps: int, every: int | None) -> int:
    """Checkpoints a run of ``steps`` writes when asked to keep one every ``every`` steps: each
    multiple of it before the end, and the final step (``training.runtime.Trainer.run``)."""
    if not every:
        return 0
    return (steps - 1) // every + 1


def pair_key(a: str, b: str) -> str:
    """A region pair's calibration key, the same in either order."""
    return "|".join(sorted((a, b)))


def goodput_key(a: str, b: str, measured: bool) -> str:
    """A goodput is a fraction of the figure it was learned against: a measured link's factor is
    kept apart from a declared one's, so a link that becomes measured does not inherit a factor
    learned against a different base."""
    return pair_key(a, b) + ("|measured" if measured else "")


def link_goodput(a: str, b: str, calibration: Calibration | None, measured: bool = False) -> float:
    if calibration:
        suffix = "|measured" if measured else ""
        for key in (f"{a}|{b}{suffix}", f"{b}|{a}{suffix}"):
            if key in calibration.link_goodput:
                return calibration.link_goodput[key]
    if a == b:
        return DEFAULT_LAN_GOODPUT
    return MEASURED_WAN_GOODPUT if measured else DEFAULT_WAN_GOODPUT


def _largest_over_pairs(
    table: dict[str, float], regions: list[str], default: float, suffix: str = ""
) -> float:
    """The largest figure the table holds for any pair among these regions (an exchange waits for
    its slowest pair), keyed "a|b" + ``suffix``, else ``default``."""
    seen = [
        table[key]
        for i, a in enumerate(regions)
        for b in regions[i + 1 :]
        if (key := pair_key(a, b) + suffix) in table
    ]
    return max(seen) if seen else default


# The fixed cost of one call of a cross-region exchange beyond its bytes and the link's latency
# (framing, HMAC, the thread-pool hand-off, the peer's server thread), per idle core: a
# two-region exchange of a 16-element tensor over the real transport on loopback took 3 ms of
# CPU for both ends together on the reference box. Calibration learns it per region pair.
DEFAULT_EXCHANGE_CALL_S = 0.003


def exchange_call_seconds(regions: list[str], calibration: Calibration | None) -> float:
    """Fixed seconds per exchange call among these regions, per idle core: the largest calibrated
    figure of any pair among them (each call waits for the slowest peer), else the default."""
    table = calibration.exchange_s if calibration else {}
    return _largest_over_pairs(table, regions, DEFAULT_EXCHANGE_CALL_S)


# The fixed cost of one cross-region exchange whatever its size and ring, beyond its calls: the
# in-node gather and broadcast loop over every parameter tensor, the payload's fingerprints, waking
# the exchange's threads (``training/sync/engine.py``), per idle core. Two-region `sync` exchanges
# of four model sizes on loopback on the reference box took 13 ms fixed with one call each
# (BENCHMARKS.md at dabf7f7, quote accuracy), of which a bare call is ``DEFAULT_EXCHANGE_CALL_S``.
# Calibration learns it per region pair, apart from the call's and the per-parameter cost.
DEFAULT_EXCHANGE_FIXED_S = 0.010


def exchange_fixed_seconds(regions: list[str], calibration: Calibration | None) -> float:
    """Fixed seconds per exchange among these regions, per idle core: the largest calibrated
    figure of any pair among them, else the default."""
    table = calibration.exchange_fixed_s if calibration else {}
    return _largest_over_pairs(table, regions, DEFAULT_EXCHANGE_FIXED_S)


# The region leader's work per exchange that grows with the model, beyond the payload's transfer:
# flattening the replica's tensors into one, encoding and decoding it, the weighted mean, writing
# it back and broadcasting it to the node's other ranks (``training/runtime.py``,
# ``training/sync/engine.py``), seconds per parameter per idle core. Two-region `sync` exchanges
# on loopback on the reference box took about 13 ms fixed plus 16 ms per million parameters
# (BENCHMARKS.md at dabf7f7, quote accuracy). Calibration learns it per region pair, apart from the fixed
# costs per exchange and per call.
DEFAULT_EXCHANGE_PARAM_S = 16e-9


def exchange_param_seconds(regions: list[str], calibration: Calibration | None) -> float:
    """Seconds per parameter of an exchange's per-parameter work among these regions, per idle
    core: the largest calibrated figure of any pair among them, else the default."""
    table = calibration.exchange_param_s if calibration else {}
    return _largest_over_pairs(table, regions, DEFAULT_EXCHANGE_PARAM_S)


# The drift of rounds that overlap the steps (DiLoCo's) is kept under "a|b" + this suffix, apart
# from blocking rounds': on a host with no idle core an overlapped round's exchange takes its CPU
# from training and lands late, a wait of its own that blocking rounds never show (in the quote
# accuracy benchmark 0.25-0.42 of the round against 0-0.14 for blocking gossip rounds).
OVERLAPPED_SUFFIX = "|overlapped"


def drift_suffix(overlapped: bool) -> str:
    """The suffix the drift of rounds so made is kept under (``OVERLAPPED_SUFFIX`` or none)."""
    return OVERLAPPED_SUFFIX if overlapped else ""


def exchange_drift(regions: list[str], calibration: Calibration | None, overlapped: bool = False) -> float:
    """How long the first region to reach an exchange made every H steps waits for the last, as a
    fraction of the H local steps before it, among these regions: the largest calibrated figure of
    any pair among them for rounds that block or, ``overlapped``, hide behind the steps, else 0
    (regions of equal speed arrive together)."""
    table = calibration.exchange_drift if calibration else {}
    return _largest_over_pairs(table, regions, 0.0, drift_suffix(overlapped))


def exchange_drift_fixed_s(
    regions: list[str], calibration: Calibration | None, overlapped: bool = False
) -> float:
    """The part of that wait that does not grow with the round: seconds per round per idle core,
    the largest calibrated figure of any pair among these regions for rounds so made, else 0."""
    table = calibration.exchange_drift_fixed_s if calibration else {}
    return _largest_over_pairs(table, regions, 0.0, drift_suffix(overlapped))


def bytes_per_s(gbps: float, goodput: float) -> float:
    return gbps * 1e9 / 8.0 * goodput


# ---------------------------------------------------------------- model arithmetic


def matmul_params(model: ModelSpec) -> int:
    return matmul_param_count(model_config(model))


def flops_per_token(model: ModelSpec, activation_checkpointing: bool) -> float:
    """Training FLOPs per token (``contracts.model.train_flops_per_token``, the formula the agents'
    reference step measures its rate with)."""
    return train_flops_per_token(model_config(model), activation_checkpointing)


def stage_flops_per_token(
    model: ModelSpec, activation_checkpointing: bool, tp: int, pp: int
) -> tuple[float, float]:
    """Training FLOPs per token on one tp rank of (the busiest pipeline stage, all stages summed).

    As the worker splits the model (``training.parallel``): contiguous layer ranges, earlier
    stages taking the remainder, the final LayerNorm and untied lm_head on the last stage. A
    block costs what ``flops_per_token`` counts per layer (6 per matmul parameter, 12·s·d of
    attention; 8 and 16 when checkpointing recomputes its forward) split tp ways; the head, 6 per
    parameter (a block checkpoints, the head does not), is computed whole on every tp rank.
    """
    work = stage_flops(model, activation_checkpointing, tp, pp)
    return max(work), sum(work)


def stage_flops(model: ModelSpec, activation_checkpointing: bool, tp: int, pp: int) -> list[float]:
    """Training FLOPs per token on one tp rank of each pipeline stage (``stage_flops_per_token``)."""
    cfg = model_config(model)
    dense, attn = (8.0, 16.0) if activation_checkpointing else (6.0, 12.0)
    block = (dense * gpt_block_param_count(cfg) + attn * cfg.seq_len * cfg.d_model) / tp
    head = 6.0 * (cfg.d_model * cfg.vocab + 2 * cfg.d_model)
    base, extra = divmod(cfg.n_layers, pp)
    work = [(base + (1 if i < extra else 0)) * block for i in range(pp)]
    work[-1] += head
    return work


def block_params(model: ModelSpec) -> int:
    return gpt_block_param_count(model_config(model))


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    return math.ceil(model.n_layers / pp)


def stage_param_counts(model: ModelSpec, pp: int) -> list[float]:
    """Parameters of each whole pipeline stage (all its tp shards), as the worker splits the model
    (``training.parallel.pipeline``): contiguous layers, earlier stages taking the remainder, the
    embeddings on the first stage, the final LayerNorm and the untied lm_head on the last. What
    each stage's own sync ring moves (``training.sync.stages``)."""
    n = model.n_params
    if pp == 1:
        return [float(n)]
    d, block = model.d_model, block_params(model)
    embed = model.vocab * d + model.seq_len * d
    head = n - model.n_layers * block - embed
    base, extra = divmod(model.n_layers, pp)
    out = [float((base + (1 if s < extra else 0)) * block) for s in range(pp)]
    out[0] += embed
    out[-1] += head
    return out


@functools.lru_cache(maxsize=4096)
def stage_params(model: ModelSpec, tp: int, pp: int) -> float:
    """Parameters held by one device of the fullest pipeline stage.

    The worker gives earlier stages the remainder layers, the embeddings (token and position) to
    the first stage and the final LayerNorm and untied lm_head to the last; TP splits the blocks'
    linear layers tp ways (``contracts.model.TP_PLAN``) and leaves the rest whole on every tp
    rank (``memory_params``)."""
    cfg = model_config(model)
    return float(max(sum(u.local for u in stage_params_of(cfg, tp, pp, 1, s).units) for s in range(pp)))


def memory_per_device(
    spec: JobSpec, tp: int, pp: int, zero: int, shard_group: int, n_micro: int, schedule: str
) -> Memory:
    """Peak bytes on one device of the fullest stage, and what they are (``memory_model``): the
    worker's fp32 weights, gradients and AdamW moments at either precision, sharded as its ZeRO
    stage shards them over the ``shard_group`` replicas of one node (one torchrun group), and the
    step's peak of activations, logits, gathered parameters and temporaries."""
    training = spec.training
    _resolved(training.precision)
    # Without ZeRO a group of two or more replicas is one DDP (or FSDP-replicated) group: alike.
    group = max(1, shard_group) if zero else min(max(1, shard_group), 2)
    layout = Layout(
        tp=tp,
        pp=pp,
        zero=zero,
        shard_group=group,
        n_micro=n_micro,
        micro_batch=training.micro_batch_size,
        precision=training.precision,
        activation_checkpointing=training.activation_checkpointing,
        schedule=schedule,
    )
    return device_memory(model_config(spec.model), layout)


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


@dataclass(frozen=True)
class PipelineLinks:
    """How one replica's stages reach each other when it spans nodes.

    ``port_out[s]`` / ``port_in[s]``: bytes/s of stage s's port into the cluster fabric (its
    node's, ``ClusterInfo.port``); ``across[s]``: boundary s -> s+1 crosses the fabric (else it
    stays inside a node, at ``local_bw``); ``latency[s]``: that boundary's one-way seconds;
    ``link_bw[s]`` (empty: none): bytes/s of the pipe between two clusters boundary s also crosses
    in each direction (``cross_cluster.pipeline_links``), inf where it stays in one cluster."""

    port_out: tuple[float, ...]
    port_in: tuple[float, ...]
    across: tuple[bool, ...]
    latency: tuple[float, ...]
    local_bw: float
    link_bw: tuple[float, ...] = ()


def replica_time(
    spec: JobSpec,
    tp: int,
    pp: int,
    zero: int,
    n_micro: int,
    replicas_on_node,
    effective_flops,
    intra_bw,
    intra_lat,
    pp_bw,
    pp_lat,
    micro_batch_s=0.0,
    step_s=0.0,
    pp_links: PipelineLinks | None = None,
    schedule: str = "1f1b",
) -> ReplicaTime:
    """One replica's step on devices of effective_flops (FLOP/s, measured × efficiency).

    intra_bw/intra_lat (bytes/s, s) carry TP and the in-cluster gradient all-reduce; pp_bw/pp_lat
    carry activations between stages. replicas_on_node: the replicas of its node (one torchrun
    group) it all-reduces gradients with every step, r (int or array; ≤ 1: none), a ring of
    2(r−1)/r·G (NCCL/gloo ring all-reduce).
    micro_batch_s / step_s: fixed seconds per micro-batch and per step beyond the FLOPs (kernel
    launches, Python, the loss all-reduce), as the node's reference step measured them.
    pp_links: a replica across nodes, whose boundaries differ (``PipelineLinks``): its schedule is
    walked (``pipeline_comm_s``); None: every boundary at pp_bw/pp_lat, the closed form.
    """
    model, training = spec.model, spec.training
    b, s = training.micro_batch_size, model.seq_len
    busiest, summed = stage_flops_per_token(model, training.activation_checkpointing, tp, pp)
    # The busiest stage paces the steady state; filling and draining the pipeline passes every
    # stage once, so the bubble is the other stages' time (sum - max; (pp-1)·t when even).
    t_mb = busiest * b * s / effective_flops + micro_batch_s
    compute = n_micro * t_mb + step_s
    bubble = (summed - busiest) * b * s / effective_flops + (pp - 1) * micro_batch_s
    tp_comm = _tp_comm_s(spec, tp, pp, n_micro, intra_bw, intra_lat) if tp > 1 else 0.0 * t_mb
    if pp > 1:
        t_ops = _stage_ops_s(spec, tp, pp, n_micro, effective_flops, micro_batch_s, tp_comm)
        message = b * s * model.d_model * RESIDUAL_BYTES
        if pp_links is None:
            pp_comm = _uniform_pp_comm_s(pp, n_micro, t_ops, t_mb, pp_lat + message / pp_bw, pp_lat, schedule)
        else:
            # Boundaries that differ (a replica across nodes): walk the schedule itself.
            fwd_part = 2.0 / (8.0 if training.activation_checkpointing else 6.0)
            fwd = [float(t) * fwd_part for t in t_ops]
            bwd = [float(t) * (1.0 - fwd_part) for t in t_ops]
            pp_comm = pipeline_comm_s(pp, n_micro, fwd, bwd, pp_links, message, schedule)
    else:
        pp_comm = 0.0 * t_mb
    dp_comm = dp_comm_s(spec, tp, pp, zero, replicas_on_node, intra_bw, intra_lat) + 0.0 * t_mb
    if np.ndim(dp_comm) == 0:
        dp_comm = float(dp_comm)
    return ReplicaTime(compute, tp_comm, dp_comm, bubble, pp_comm)


def _tp_comm_s(spec: JobSpec, tp: int, pp: int, n_micro: int, intra_bw, intra_lat):
    """Tensor parallelism's all-reduces of a stage's micro-batches: per layer 4 (6 with
    recomputation), each of b·s·d·w bytes over the fabric."""
    model, training = spec.model, spec.training
    per_layer = 6 if training.activation_checkpointing else 4
    act = training.micro_batch_size * model.seq_len * model.d_model * activation_bytes(training.precision)
    return n_micro * layers_per_stage(model, pp) * per_layer * allreduce_s(tp, act, intra_bw, intra_lat)


def replica_totals(
    spec: JobSpec,
    tp: int,
    pp: int,
    zero: int,
    n_micro,
    group_sizes: tuple[int, ...],
    effective_flops,
    intra_bw,
    intra_lat,
    pp_bw,
    pp_lat,
    schedule: str = "1f1b",
) -> list:
    """``replica_time(...).total`` at each of ``group_sizes``, the same figures: only the gradient
    all-reduce depends on the group, so the stages are walked once (the screen and every problem
    price each layout at two group sizes)."""
    parts = replica_time(
        spec, tp, pp, zero, n_micro, group_sizes[0], effective_flops, intra_bw, intra_lat, pp_bw, pp_lat,
        schedule=schedule,
    )  # fmt: skip
    out = [parts.total]
    for r in group_sizes[1:]:
        # As replica_time shapes it (0 × compute: 0 · t_mb, nan where t_mb is not finite).
        dp_comm = dp_comm_s(spec, tp, pp, zero, r, intra_bw, intra_lat) + 0.0 * parts.compute
        if np.ndim(dp_comm) == 0:
            dp_comm = float(dp_comm)
        out.append(replace(parts, dp_comm=dp_comm).total)
    return out


def _stage_ops_s(
    spec: JobSpec, tp: int, pp: int, n_micro: int, effective_flops, micro_batch_s, tp_comm
) -> list:
    """Each stage's own op times for one micro-batch (its layers, the head on the last, its share
    of the tp all-reduces), so a fast stage's slack can absorb a slow boundary as it does."""
    model, training = spec.model, spec.training
    b, s = training.micro_batch_size, model.seq_len
    flops = stage_flops(model, training.activation_checkpointing, tp, pp)
    base, extra = divmod(model.n_layers, pp)
    tp_mb = tp_comm / n_micro / max(layers_per_stage(model, pp), 1)  # per layer of a micro-batch
    return [
        f * b * s / effective_flops + micro_batch_s + tp_mb * (base + (1 if i < extra else 0))
        for i, f in enumerate(flops)
    ]


def _uniform_pp_comm_s(pp: int, n_micro: int, t_ops: list, t_mb, hop, pp_lat, schedule: str):
    """What stage transfers add to the step where every boundary takes ``hop`` seconds (one
    latency and a message at pp_bw), in closed form."""
    if schedule == "gpipe":
        # Sends go out unwaited: fill and drain put every hop on the critical path twice
        # (activation forward, its gradient back); otherwise a transfer hides behind the
        # opposite pass (a forward is a third of fwd+bwd) unless it is slower.
        return 2.0 * (pp - 1) * hop + 2.0 * n_micro * np.maximum(0.0, hop - t_mb / 3.0)
    # 1F1B waits for each steady-state exchange with a neighbour (one before each pass, its
    # bytes leaving once the recv's notice is back: hop + λ), so a stage's cycle is its op plus
    # one exchange per neighbour, and the slowest cycle paces the pipeline; fill and drain pay
    # each hop twice (receivers already waiting).
    exchange = hop + pp_lat
    cycle = functools.reduce(
        np.maximum,
        [t + (1.0 if i in (0, pp - 1) else 2.0) * exchange for i, t in enumerate(t_ops)],
    )
    busiest_op = functools.reduce(np.maximum, t_ops)
    return 2.0 * (pp - 1) * hop + n_micro * (cycle - busiest_op)


Step = tuple  # ("op" | "send" | "recv", forward, i) or ("wait", keys)


def _stage_program(schedule: str, pp: int, st: int, m: int) -> list[Step]:
    """What stage st does, in order, as ``torch.distributed.pipelining`` runs it (ScheduleGPipe /
    Schedule1F1B ``_step_microbatches``, torch 2.4 to 2.14): compute an op, post a send or a recv
    of micro-batch i's activation (forward True) or gradient, wait for some it posted."""
    first, last = st == 0, st == pp - 1
    prog: list[Step] = []

    def post(kind: str, forward: bool, i: int) -> tuple:
        sends_to_none = last if forward else first
        recvs_from_none = first if forward else last
        if sends_to_none if kind == "send" else recvs_from_none:
            return ()
        prog.append((kind, forward, i))
        return ((kind, forward, i),)

    if schedule == "gpipe":
        # Every op waits for its input and leaves its output's send unwaited until the turn.
        for forward in (True, False):
            sent: tuple = ()
            for i in range(m):
                prog.append(("wait", post("recv", forward, i)))
                prog.append(("op", forward, i))
                sent += post("send", forward, i)
            prog.append(("wait", sent))
        return prog
    warm = min(m, pp - st)  # torch counts the steady state's first forward in
    sending: tuple = ()
    for i in range(warm):
        prog.append(("wait", post("recv", True, i)))
        prog.append(("op", True, i))
        prog.append(("wait", sending))  # the previous forward's send, still in flight
        sending = post("send", True, i) if i < warm - 1 else ()
    held, f, b = warm - 1, warm, 0  # the last warm-up forward's send joins the next batch
    while True:
        # Steady state: one batch with one neighbour before each pass, waited for in full.
        prog.append(("wait", post("send", True, held) + post("recv", False, b)))
        prog.append(("op", False, b))
        b += 1
        if f == m:
            break
        prog.append(("wait", post("send", False, b - 1) + post("recv", True, f)))
        prog.append(("op", True, f))
        held, f = f, f + 1
    sending = post("send", False, b - 1)
    while b < m:
        prog.append(("wait", post("recv", False, b)))
        prog.append(("op", False, b))
        prog.append(("wait", sending))
        sending = post("send", False, b)
        b += 1
    prog.append(("wait", sending))
    return prog


@functools.lru_cache(maxsize=512)
def _compiled_programs(schedule: str, pp: int, m: int) -> tuple[tuple[tuple, ...], ...]:
    """``_stage_program`` of every stage with its messages numbered, for ``_pipeline_makespan``:
    message (sender, forward, i) is ``2 * pp * i + 2 * sender + forward``; its send completes in
    slot 2·id and its recv in slot 2·id + 1. Steps: (0, seconds index 0 forward / 1 backward),
    (1, slots waited for), (2, id, side posted: 0 send, 1 recv, sender, forward)."""

    def ident(src: int, forward: bool, i: int) -> int:
        return 2 * pp * i + 2 * src + int(forward)

    out = []
    for st in range(pp):
        prog: list[tuple] = []
        for step in _stage_program(schedule, pp, st, m):
            kind = step[0]
            if kind == "op":
                prog.append((0, 0 if step[1] else 1))
            elif kind == "wait":
                slots = []
                for k, forward, i in step[1]:
                    if k == "send":
                        slots.append(2 * ident(st, forward, i))
                    else:
                        slots.append(2 * ident(st - 1 if forward else st + 1, forward, i) + 1)
                prog.append((1, tuple(slots)))
            else:
                forward, i = step[1], step[2]
                src = st if kind == "send" else (st - 1 if forward else st + 1)
                prog.append((2, ident(src, forward, i), 0 if kind == "send" else 1, src, forward))
        out.append(tuple(prog))
    return tuple(out)


def _ready_at(slots: tuple[int, ...], done_at: list[float | None], now: float) -> float | None:
    """When every one of ``slots`` has completed, not before ``now``; None while one has not."""
    t = now
    for x in slots:
        got = done_at[x]
        if got is None:
            return None
        if got > t:
            t = got
    return t


class _Transfers:
    """The fabric a pipeline's messages cross, and when each pipe is next free: per (sender,
    direction) the last message's end (messages between two stages go in order), and per stage
    its fabric port's, to send and to receive. Without links or bytes, transfers take no time."""

    __slots__ = ("free", "nbytes", "links", "pair_free", "tx", "rx")

    def __init__(self, pp: int, links: PipelineLinks | None, nbytes: float) -> None:
        self.free = nbytes <= 0 or links is None
        self.nbytes, self.links = nbytes, links
        self.pair_free = [0.0] * (2 * pp)
        self.tx, self.rx = [0.0] * pp, [0.0] * pp

    def book(self, src: int, forward: bool, sent_at: float, recv_at: float) -> tuple[float, float]:
        """(send complete, recv complete) of the message ``src`` posted forward (or back): its
        bytes leave at the later of the send and the recv's notice (one latency), after the
        pair's previous message; across the fabric they hold the sender's port for
        nbytes/port_out, the receiver's for nbytes/port_in, and the boundary's link."""
        if self.free:
            done = sent_at if sent_at > recv_at else recv_at
            return done, done
        links, nbytes = self.links, self.nbytes
        assert links is not None
        to = src + 1 if forward else src - 1
        k = src if forward else to
        lane = 2 * src + forward
        start = max(sent_at, recv_at + links.latency[k], self.pair_free[lane])
        if links.across[k]:
            tx, rx = self.tx, self.rx
            start = max(start, tx[src], rx[to])
            t_out, t_in = nbytes / links.port_out[src], nbytes / links.port_in[to]
            tx[src], rx[to] = start + t_out, start + t_in
            done = start + max(t_out, t_in, nbytes / links.link_bw[k] if links.link_bw else 0.0)
        else:
            done = start + nbytes / links.local_bw
        self.pair_free[lane] = done
        return done, done + links.latency[k]


def _pipeline_makespan(
    m: int,
    fwd: Sequence[float],
    bwd: Sequence[float],
    links: PipelineLinks | None,
    nbytes: float,
    schedule: str,
) -> float:
    """When the last op of one pipeline ends.

    Each stage runs its program (``_stage_program``): the schedule's ops one at a time, and its
    transfers in the batches and waits ``torch.distributed.pipelining`` issues, so in 1F1B's
    steady state a stage does not compute while its tensors are on the wire. A transfer is a
    rendezvous (gloo sends an unbound buffer once the receiver's recv notice has come back, one
    latency; NCCL's send waits for the receiver's buffer alike): its bytes leave at the later of
    the send and the recv's notice, messages between two stages in order; across the fabric a
    message holds the sender's port for nbytes/port_out and the receiver's for nbytes/port_in,
    and crosses the boundary's link (``_Transfers``). The send completes when its last byte has
    left, the recv one latency later. ``nbytes`` 0 or no links: transfers take no time (the bare
    schedule). Messages and their completions are numbered (``_compiled_programs``): this walk
    runs thousands of times on a quote's first pricing of a pipeline."""
    pp = len(fwd)
    progs = _compiled_programs(schedule, pp, m)
    seconds = (tuple(fwd), tuple(bwd))
    transfers = _Transfers(pp, links, nbytes)
    pc = [0] * pp
    posted: list[float | None] = [None] * (4 * pp * m)  # per message: its send's and its recv's post
    done_at: list[float | None] = [None] * (4 * pp * m)  # per slot: when that side completed
    blocked: list[tuple | None] = [None] * pp  # the slots a stage waits on, not all complete yet
    events: list[tuple[float, int, int]] = []  # (t, seq, stage to resume)
    seq, now = 0, 0.0
    # Every stage starts at 0 in order, then resumes at its events in time order (so every
    # transfer books the ports after those matched before it).
    first = 0
    while True:
        if first < pp:
            st, first = first, first + 1
        elif events:
            now, _, st = heapq.heappop(events)
        else:
            break
        prog = progs[st]
        at = pc[st]
        while at < len(prog):
            step = prog[at]
            at += 1
            kind = step[0]
            if kind == 0:  # compute an op
                seq += 1
                heapq.heappush(events, (now + seconds[step[1]][st], seq, st))
                break
            if kind == 1:  # wait for some transfers
                t = _ready_at(step[1], done_at, now)
                if t is None:
                    blocked[st] = step[1]
                    break
                if t > now:
                    seq += 1
                    heapq.heappush(events, (t, seq, st))
                    break
                continue
            _, ident, side, src, forward = step  # post a send or a recv
            posted[2 * ident + side] = now
            other = posted[2 * ident + 1 - side]
            if other is None:
                continue
            sent_recv = (now, other) if side == 0 else (other, now)
            done_at[2 * ident], done_at[2 * ident + 1] = transfers.book(src, forward, *sent_recv)
            for waiter in (src, src + 1 if forward else src - 1):
                waits = blocked[waiter]
                t = None if waits is None else _ready_at(waits, done_at, now)
                if t is not None:
                    blocked[waiter] = None
                    seq += 1
                    heapq.heappush(events, (t, seq, waiter))
        pc[st] = at
    if any(n < len(p) for n, p in zip(pc, progs, strict=True)) or any(b is not None for b in blocked):
        raise ValueError("pipeline schedule deadlocked")  # cannot happen for these programs
    return now


def pipeline_comm_s(
    pp: int,
    m: int,
    fwd: Sequence[float],
    bwd: Sequence[float],
    links: PipelineLinks,
    nbytes: float,
    schedule: str = "1f1b",
) -> float:
    """What stage-to-stage transfers of ``nbytes`` add to one pipeline of m micro-batches of
    fwd[s]/bwd[s] seconds on stage s: its makespan with them less without. Past a few rounds the
    schedule is periodic, so a long one is extrapolated from two shorter ones (the steady state
    adds the same per micro-batch)."""
    if pp <= 1:
        return 0.0
    return _pipeline_comm_s(pp, m, tuple(fwd), tuple(bwd), links, float(nbytes), schedule)


@functools.lru_cache(maxsize=4096)
def _pipeline_comm_s(
    pp: int,
    m: int,
    fwd: tuple[float, ...],
    bwd: tuple[float, ...],
    links: PipelineLinks,
    nbytes: float,
    schedule: str,
) -> float:
    """``pipeline_comm_s``, kept per input: a fleet's like replicas walk the same schedule."""

    def extra(n: int) -> float:
        return _pipeline_makespan(n, fwd, bwd, links, nbytes, schedule) - _bare_makespan(
            n, fwd, bwd, schedule
        )

    m1, m2 = 2 * pp, 4 * pp
    if m <= m2:
        return extra(m)
    e1, e2 = extra(m1), extra(m2)
    return e2 + (m - m2) * (e2 - e1) / (m2 - m1)


@functools.lru_cache(maxsize=4096)
def _bare_makespan(m: int, fwd: tuple[float, ...], bwd: tuple[float, ...], schedule: str) -> float:
    """``_pipeline_makespan`` with transfers that take no time: the links are never read, so
    pipelines of like stages on other links share it."""
    return _pipeline_makespan(m, fwd, bwd, None, 0.0, schedule)


def dp_comm_s(spec: JobSpec, tp: int, pp: int, zero: int, replicas_on_node, intra_bw, intra_lat):
    """The gradient all-reduce of r replicas on one node, every step: DDP and FSDP reduce the
    fp32 gradients the worker keeps over a ring of the r (2(r−1)/r of them, 2(r−1) hops: NCCL's
    and gloo's ring); ZeRO-3 adds the parameter all-gathers (3Ψ instead of 2Ψ). 0 for r ≤ 1."""
    r = np.maximum(np.asarray(replicas_on_node, dtype=float), 1.0)
    grad_bytes = stage_params(spec.model, tp, pp) * GRAD_BYTES
    volume = 1.5 if zero == 3 else 1.0
    bw, lat = np.asarray(intra_bw, dtype=float), np.asarray(intra_lat, dtype=float)
    return volume * (2.0 * (r - 1) / r * grad_bytes / bw + 2.0 * (r - 1) * lat)


def grad_ring_s(replicas: int, grad_bytes: float, bw: float, lat: float, zero: int) -> float:
    """``dp_comm_s`` of one ring of ``replicas`` devices moving ``grad_bytes`` over a hop of
    ``bw`` bytes/s and ``lat`` seconds (a scalar: one stage's ring of a group across nodes)."""
    if replicas <= 1:
        return 0.0
    volume = 1.5 if zero == 3 else 1.0
    return volume * (2.0 * (replicas - 1) / replicas * grad_bytes / bw + 2.0 * (replicas - 1) * lat)


# DDP's buckets at its defaults (torch.nn.parallel.DistributedDataParallel): the first holds
# 1 MiB of gradients, each later one 25 MiB; each bucket is one all-reduce.
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024


def ddp_calls_per_step(grad_bytes: float) -> int:
    """All-reduces among a node's DDP ranks per step: one per gradient bucket, once per step (the
    worker skips the reduction on all but the last micro-batch, ``parallelize.grad_sync``), and
    the loss's (``Trainer._cluster_loss``). Both run inside the worker's ``compute_s``."""
    later = max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(later / DDP_BUCKET_BYTES) + 1


def host_dp_comm_s(
    grad_bytes: float, ranks: int, share: float, call_s: float, gbps: float, wait_s: float
) -> float:
    """The data-parallel collectives of ``ranks`` one-thread CPU ranks on one host per step, priced
    from the host's own measured all-reduce (``NodeProfileInfo.collective_*``: a small call's
    seconds between two ranks, ``call_s``; the payload's rate beyond it, ``gbps``; the wait per
    hop for a peer's turn where ranks outnumber cores, ``wait_s``) at the plan's host share σ.

    Each of ``ddp_calls_per_step`` calls is a ring of 2(r−1) hops, each half a two-rank call's
    fixed cost, plus the wait on the fraction min(1, σ − 1) of its hops that find their peer's
    core taken (none where every rank has a core: σ ≤ 1; all of them from two ranks per core);
    the gradients cross the ring once, 2(r−1)/r of them, at the measured rate, slowed by σ (the
    reduction is CPU work of the ranks' own). 0 for one rank."""
    if ranks <= 1:
        return 0.0
    if call_s <= 0 or gbps <= 0:
        raise ValueError(f"a host's collective needs call_s > 0 and gbps > 0, got {call_s}, {gbps}")
    hops = 2.0 * (ranks - 1)
    crowded = min(1.0, max(0.0, share - 1.0))
    per_call = hops * (call_s / 2.0 + crowded * wait_s)
    payload = hops / ranks * grad_bytes * 8.0 / (gbps * 1e9) * max(1.0, share)
    return ddp_calls_per_step(grad_bytes) * per_call + payload


# ---------------------------------------------------------------- cross-cluster sync


# Modes that exchange every H steps (training.sync.strategies: ssp and async send their update
# at each round's start, like the anchored modes); sync reduces gradients every step.
PERIODIC_MODES = ("local_sgd", "diloco", "gossip", "ssp", "async")


def sync_every(sync: SyncSpec) -> int:
    """Steps between cross-cluster exchanges: every step for sync, H otherwise."""
    return _chosen(sync, "every").every if sync.mode in PERIODIC_MODES else 1


def exchanges_per_step(sync: SyncSpec, steps: int) -> float:
    """Exchanges per step, amortised: ceil(steps/H) rounds, the last one producing the final model."""
    return math.ceil(steps / sync_every(sync)) / steps


def param_bytes_per_param(sync: SyncSpec) -> float:
    """Bytes per parameter where the runtime sends parameters rather than updates (the async
    server's answer, gossip): fp32 without compression, else bf16 (``Strategy.param_codec``:
    int8 or top-k of raw weights would lose too much)."""
    plain = _chosen(sync, "compression").compression in (None, "none", "fp32")
    return SYNC_BASE_BYTES_PER_PARAM if plain else 2.0


def wan_bytes_per_leader(sync: SyncSpec, n_params: float, n_regions) -> np.ndarray:
    """Bytes each sync participant sends per exchange among n_regions participants (the name
    is historical: participants are nodes, ``ring_sync_s``), as each mode's strategy moves them
    (``training.sync``):

    - sync, local SGD, DiLoCo: a ring all-reduce (``DenseReducer``), 2(P−1)/P of the payload;
      top-k too, since every hop re-encodes its chunk as top-k (``collective._ring``);
    - ssp: its update to every peer (``StaleSync``), (P−1) payloads;
    - async: each of the P−1 others sends its update to the server and gets the parameters back
      (``AsyncServer``): (P−1)·(update + parameters) in all, averaged over the P participants;
    - gossip: the payload to each of min(k, P−1) peers.
    """
    rr = np.asarray(n_regions, dtype=float)
    payload = n_params * sync_bytes_per_param(sync)
    if sync.mode == "gossip":
        out = np.minimum(sync.gossip_peers, rr - 1) * payload
    elif sync.mode == "ssp":
        out = (rr - 1) * payload
    elif sync.mode == "async":
        out = (rr - 1) / np.maximum(rr, 1) * (payload + n_params * param_bytes_per_param(sync))
    else:
        out = 2.0 * (rr - 1) / np.maximum(rr, 1) * payload
    return np.where(rr >= 2, out, 0.0)


def wan_latency_hops(sync: SyncSpec, n_regions) -> np.ndarray:
    """One-way link latencies on an exchange's critical path: every call of it
    (``exchange_rounds``) waits for its peer's answer, a round trip, 2 hops."""
    rr = np.asarray(n_regions, dtype=int)
    # exchange_rounds over an array (the search prices thousands of placements per quote).
    one_round = sync.mode in ("gossip", "ssp", "async") or rr == 2
    calls = np.where(rr < 2, 0.0, np.where(one_round, 1.0, 2.0 * (rr - 1)))
    return 2.0 * calls


def exchange_rounds(sync: SyncSpec, n_regions: int) -> int:
    """Calls a participant makes one after another in one exchange (``training.sync``): a ring
    over three or more participants takes 2(P−1) hops; with two each pushes to the other at
    once (one round); ssp pushes to every peer at once, async makes one call to the server and a
    gossip round calls its peers concurrently (one round each)."""
    if n_regions < 2:
        return 0
    if sync.mode in ("gossip", "ssp", "async") or n_regions == 2:
        return 1
    return 2 * (n_regions - 1)


def wan_time_factor(sync: SyncSpec, n_params: float, n_regions) -> np.ndarray:
    """Seconds-per-(byte/s) coefficient of the exchange: bytes that cross its slowest hop's port,
    one direction (links are full duplex).

    Gossip exchanges with each peer on its own link concurrently, so one payload crosses the
    slowest link; the ring serialises 2(P−1)/P of the payload through every participant; ssp's
    P−1 pushes leave through the sender's port together; the async server's port takes the P−1
    updates in and then sends the P−1 answers out (each call's answer follows its update).
    """
    rr = np.asarray(n_regions, dtype=float)
    if sync.mode == "gossip":
        per = np.full_like(rr, n_params * sync_bytes_per_param(sync))
        return np.where(rr >= 2, per, 0.0)
    if sync.mode == "async":
        per = (rr - 1) * n_params * (sync_bytes_per_param(sync) + param_bytes_per_param(sync))
        return np.where(rr >= 2, per, 0.0)
    return wan_bytes_per_leader(sync, n_params, rr)


def local_sync_s(sync: SyncSpec, n_params: float, bw, lat):
    """Two payloads over one in-region hop: what the search's heuristic and MILP rank an
    in-region exchange by (the exchange itself is ``ring_sync_s``)."""
    return 2.0 * n_params * sync_bytes_per_param(sync) / bw + 2.0 * lat


def ring_sync_s(sync: SyncSpec, n_params: float, participants, bw_min, lat_max):
    """Seconds of one exchange among ``participants`` sync participants (one per node), as the
    runtime runs it (``training.sync.collective``): a flat ring (an all-to-all for two, one
    gossip round for gossip) whose every hop goes over its own link; the bytes cross the ring's
    slowest hop (``bw_min``, bytes/s) and every call pays a round trip on its slowest hop
    (``lat_max``, one way, with half the call's fixed cost). Rises with ``participants``."""
    factor = wan_time_factor(sync, n_params, participants)
    hops = wan_latency_hops(sync, participants)
    return factor / bw_min + hops * lat_max


HIERARCHICAL_MODES = ("sync", "local_sgd", "diloco")


def region_gather_s(sync: SyncSpec, n_params: float, members, bw, lat):
    """Seconds of one region's gather in the hierarchical exchange: its ``members`` − 1 other
    participants push their payloads to its head at once (one call each), through the region's
    slowest hop ``bw`` (bytes/s; they share the head's port) with ``lat`` one way (half a call's
    cost included). The head's answer back takes as long (its port out, full duplex). Vectorised."""
    payload = n_params * sync_bytes_per_param(sync)
    if isinstance(members, int | float) and isinstance(bw, int | float) and isinstance(lat, int | float):
        # One region's figures (the search scores thousands of solutions a quote this way): the
        # same formula without numpy's per-call cost.
        others = max(float(members) - 1.0, 0.0)
        return others * payload / bw + 2.0 * float(lat) if others > 0 else 0.0
    m = np.maximum(np.asarray(members, dtype=float) - 1.0, 0.0)
    return np.where(m > 0, m * payload / np.where(m > 0, bw, 1.0) + 2.0 * np.asarray(lat, dtype=float), 0.0)


def hierarchical_parts(sync: SyncSpec, n_params: float, groups, gather_s, wan_bw, wan_lat):
    """(seconds inside the regions, seconds over the WAN) of one hierarchical exchange as the
    runtime runs it (``training.sync.collective``, ``DenseReducer._hierarchical``): every region
    gathers its members' payloads into its head (``gather_s``, the slowest region's
    ``region_gather_s``), the ``groups`` heads ring (reduce-scatter and all-gather, 2(G−1) calls,
    also for two heads) with 2(G−1)/G of the payload through each at ``wan_bw`` and ``wan_lat``
    (the slowest link and largest latency between the regions), and each head answers its members
    with the averaged chunks (as long as the gather). Vectorised."""
    g = np.asarray(groups, dtype=float)
    payload = n_params * sync_bytes_per_param(sync)
    wan = 2.0 * (g - 1) / np.maximum(g, 1) * payload / wan_bw + 4.0 * (g - 1) * wan_lat
    return 2.0 * np.asarray(gather_s, dtype=float), np.where(g >= 2, wan, 0.0)


def hierarchical_pays(sync: SyncSpec, groups, largest, flat_s, hier_s):
    """Where the runtime runs the hierarchical exchange instead of the flat ring: a dense mode,
    two or more regions, one of them with two or more participants, and faster as priced."""
    if sync.mode not in HIERARCHICAL_MODES:
        return np.zeros_like(np.asarray(flat_s, dtype=float), dtype=bool)
    return (np.asarray(groups) >= 2) & (np.asarray(largest) >= 2) & (hier_s < flat_s)


def sync_overlapped(sync: SyncSpec) -> bool:
    """Whether the exchange runs concurrently with local compute by the mode's nature.

    SSP with staleness ≥ 1 and async overlap per-step traffic. Sync, local SGD and gossip rounds
    stop the replicas while they exchange. DiLoCo blocks unless the option's runtime settings
    overlap it, which the runtime does whenever two or more nodes sync (priced in
    ``runtime_pricing``).
    """
    if sync.mode == "async":
        return True
    return sync.mode == "ssp" and sync.staleness >= 1


def streams_beside_steps(mode: str) -> bool:
    """Whether the runtime moves a mode's payloads on background threads while the replicas go on
    training: a gossip round's exchanges (``GossipSync._launch``), ssp's sender per peer and the
    async server's pushes. On a CPU host those payloads take turns with training for the cores,
    so how fast they arrive says nothing of how fast a payload the steps wait for moves."""
    return mode in ("gossip", "ssp", "async")


def wan_sync_per_step(sync: SyncSpec, steps: int, t_sync, t_local):
    """Seconds the exchange adds to an average step."""
    per = t_sync * exchanges_per_step(sync, steps)
    if sync_overlapped(sync):
        return np.maximum(0.0, per - t_local)
    return per
