"""Quick sync calibration on a job's own model and data: a few DiLoCo rounds with a candidate
codec/overlap and with fp32 blocking, from the same start on the same data, compared on held-out
batches. One process on CPU: ``regions`` replicas train in turn, each on the stream its region
would get (``build_stream``), with the worker's optimizer and schedule (``training.runtime``);
the rounds average through ``RingSim`` (the ring's compression points, codec and residuals),
apply the outer step (``outer_step``), and an overlapped round lands ``delay`` steps late with the
merge real jobs use (``merge_late``). Bounded: ``budget_s`` caps the wall time, and the trials
that do not fit are left out (the result says which were measured)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from contracts.model import GPTConfig, model_config
from contracts.sync_calibration import CalibrationTrial, SyncCalibration
from contracts.sync_config import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM
from contracts.sync_delay import overlap_merge_for, progress_lag_steps
from contracts.worker_config import DataSpec, TrainingSpec, WorkerConfig
from training.compression.codecs import get_codec
from training.data.streams import build_stream
from training.models.gpt import GPT
from training.runtime import lr_lambda
from training.step import build_optimizer
from training.sync.algorithms.outer import eager_start, merge_late, outer_step
from training.sync.ring_sim import RingSim

HELDOUT_STEP = 1 << 30  # held-out batches come from step numbers no run reaches
MAX_REGIONS = 8


@dataclass(frozen=True)
class Setting:
    """One way to run the rounds: the codec (none: fp32), overlapped with ``delay`` or blocking."""

    compression: str = "none"
    overlap: bool = False
    delay: int = 0
    merge: str = "progress"  # how an overlapped round lands (``merge_late``)
    mix: float = 0.5


@dataclass(frozen=True)
class Slice:
    """The part of the job a calibration trains: its model, data and optimiser, ``steps`` steps
    of ``local_batch`` sequences per region, rounds every ``every`` steps over ``regions``."""

    model: GPTConfig
    data: DataSpec
    training: TrainingSpec
    local_batch: int
    every: int
    steps: int
    regions: int = 3
    heldout_batches: int = 16
    outer_lr: float = DILOCO_OUTER_LR
    outer_momentum: float = DILOCO_OUTER_MOMENTUM
    int8_block: int = 2048
    chunk_bytes: int = 1 << 20
    region_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 2 <= self.regions <= MAX_REGIONS:
            raise InvalidArgument(f"regions must be 2 to {MAX_REGIONS}, got {self.regions}", field="regions")
        if not 1 <= self.every <= self.steps:
            raise InvalidArgument(f"every must be 1 to steps ({self.steps}), got {self.every}", field="every")
        if self.local_batch < 1 or self.heldout_batches < 2:
            raise InvalidArgument("local_batch >= 1 and heldout_batches >= 2 needed", field="local_batch")


def _worker_config(sl: Slice) -> WorkerConfig:
    """The worker's own config for the slice (what ``build_optimizer`` reads)."""
    training = sl.training.model_copy(update={"steps": sl.training.steps, "local_batch": sl.local_batch})
    return WorkerConfig(job_id="calibration", region="calibration", cluster="calibration",
                        model=sl.model, data=sl.data, training=training)  # fmt: skip


def _region(sl: Slice, i: int) -> str:
    return sl.region_names[i] if i < len(sl.region_names) else (sl.data.region or f"region-{i}")


def _train(sl: Slice, setting: Setting) -> GPT:
    """The slice's steps in every region with ``setting``'s rounds; the final model (every region's
    after the final blocking round, as a job ends)."""
    cfg = _worker_config(sl)
    t = cfg.training
    models = [GPT(sl.model, seed=t.seed) for _ in range(sl.regions)]
    opts = [build_optimizer(m, cfg) for m in models]
    streams = [
        build_stream(sl.data, worker_region=_region(sl, i), vocab=sl.model.vocab, seq_len=sl.model.seq_len,
                     replica=i, replicas=sl.regions)
        for i in range(sl.regions)
    ]  # fmt: skip
    ring = RingSim(get_codec(setting.compression, int8_block=sl.int8_block), sl.chunk_bytes)
    anchor = parameters_to_vector(models[0].parameters()).detach().clone()
    momentum: Tensor | None = None
    pending: tuple[int, Tensor, list[Tensor]] | None = None  # (apply at, new anchor, snapshots)
    for step in range(1, sl.steps + 1):
        for m, opt, stream in zip(models, opts, streams, strict=True):
            for g in opt.param_groups:
                g["lr"] = t.lr * lr_lambda(step - 1, t.warmup, t.steps, t.min_lr_ratio)
            x, y = stream.batch(step, sl.local_batch)
            _, loss = m(x, y)
            loss.backward()
            if t.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(m.parameters(), t.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        flats = [parameters_to_vector(m.parameters()).detach() for m in models]
        final = step == sl.steps
        if pending is not None and (final or step >= pending[0]):
            _, new_anchor, snaps = pending
            flats = [
                merge_late(f, new_anchor, s, setting.merge, setting.mix)
                for f, s in zip(flats, snaps, strict=True)
            ]
            anchor, pending = new_anchor, None
        if final or step % sl.every == 0:
            avg = ring.mean([anchor - f for f in flats])
            late = not final and setting.overlap and setting.delay > 0
            # Overlapped: each region trains on from its own outer step where the merge does
            # (``eager_start``, with the momentum before this round's), as a job's regions do.
            starts = [
                eager_start(anchor, f, momentum, sl.outer_lr, sl.outer_momentum, True, setting.merge)
                for f in (flats if late else [])
            ]
            new_anchor, momentum = outer_step(anchor, avg, momentum, sl.outer_lr, sl.outer_momentum)
            if not late:
                flats, anchor = [new_anchor.clone() for _ in flats], new_anchor
            else:
                flats = [f if s is None else s for f, s in zip(flats, starts, strict=True)]
                pending = (step + setting.delay, new_anchor, [f.clone() for f in flats])
        for m, f in zip(models, flats, strict=True):
            vector_to_parameters(f, m.parameters())
    return models[0]


@torch.no_grad()
def heldout_losses(sl: Slice, model: GPT) -> list[float]:
    """Loss per held-out batch: a stream no region trains on, at steps no run reaches."""
    m = sl.model
    stream = build_stream(sl.data, worker_region=_region(sl, 0), vocab=m.vocab, seq_len=m.seq_len,
                          replica=sl.regions, replicas=sl.regions + 1)  # fmt: skip
    model.eval()
    out = []
    for b in range(sl.heldout_batches):
        x, y = stream.batch(HELDOUT_STEP + b, sl.local_batch)
        out.append(float(model(x, y)[1]))
    return out


def paired_ratio(candidate: list[float], base: list[float]) -> tuple[float, float]:
    """Mean candidate loss over mean base loss on the same batches, and its standard error from
    the paired differences (the batches' own difficulty cancels)."""
    n = len(base)
    if n < 2 or len(candidate) != n:
        raise InvalidArgument(
            f"need >= 2 paired batches, got {len(candidate)} and {n}", field="heldout_batches"
        )
    mean_base = sum(base) / n
    diffs = [c - b for c, b in zip(candidate, base, strict=True)]
    mean_d = sum(diffs) / n
    var = sum((d - mean_d) ** 2 for d in diffs) / (n - 1)
    return 1.0 + mean_d / mean_base, math.sqrt(var / n) / mean_base


def calibrate(
    sl: Slice, candidates: list[Setting], budget_s: float = 600.0, stop_at_pass: bool = False
) -> SyncCalibration | None:
    """fp32 blocking, then each candidate in order while the budget allows (a candidate is started
    only if a run as long as the baseline's still fits), and, with ``stop_at_pass``, until one
    passes (``CalibrationTrial.passes``: candidates come cheapest first, so the rest would not be
    chosen); None when not even one candidate fits."""
    if not candidates:
        raise InvalidArgument("no candidate setting to calibrate", field="candidates")
    t0 = time.monotonic()
    base = heldout_losses(sl, _train(sl, Setting()))
    one_run = time.monotonic() - t0
    trials = []
    for c in candidates:
        if time.monotonic() - t0 + one_run > budget_s:
            break
        ratio, se = paired_ratio(heldout_losses(sl, _train(sl, c)), base)
        late = {"delay": c.delay, "merge": c.merge} if c.overlap else {}
        fields = {"compression": c.compression, "overlap": c.overlap, **late}
        trial = CalibrationTrial.model_validate(fields | {"loss_ratio": ratio, "stderr": se})
        trials.append(trial)
        if stop_at_pass and trial.passes():
            break
    if not trials:
        return None
    return SyncCalibration(
        every=sl.every, steps=sl.steps, regions=sl.regions, heldout_batches=sl.heldout_batches,
        seconds=time.monotonic() - t0, trials=trials,
    )  # fmt: skip


# The planner's smallest H (``planner.sync_choice.EVERY_LADDER``) and its largest overlap lag, a
# tenth of a round: calibrated at the most rounds and the latest landing it allows.
DEFAULT_EVERY = 20
DEFAULT_ROUNDS = 3


def candidates_for(every: int) -> list[Setting]:
    """What the planner may pick for DiLoCo, cheapest first: int8 overlapped, then fp32 overlapped
    (so a failing int8 can fall back to overlap without compression before blocking)."""
    delay = progress_lag_steps(every)
    merge = overlap_merge_for(delay, every)
    return [Setting("int8", True, delay, merge), Setting("none", True, delay, merge)]


def slice_for(
    spec: JobSpec,
    regions: int = 3,
    every: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    local_batch: int | None = None,
    heldout_batches: int = 16,
) -> Slice:
    """The first ``rounds`` rounds of a job spec's run (its model, data, optimiser and schedule),
    with each region's share of its global batch unless ``local_batch`` is given."""
    if spec.entrypoint:
        why = "calibration trains the built-in GPT, not a bring-your-own entrypoint"
        raise InvalidArgument(why, field="entrypoint")
    d = spec.data
    if d.kind == "tokens" and d.path is None:
        raise InvalidArgument("calibration reads token data from a local data.path", field="data.path")
    h = every or (spec.sync.every if isinstance(spec.sync.every, int) else DEFAULT_EVERY)
    t = spec.training
    batch = local_batch or max(1, t.global_batch_tokens // spec.model.seq_len // regions)
    training = TrainingSpec(steps=t.steps, lr=t.lr, warmup=t.warmup_steps, weight_decay=t.weight_decay,
                            grad_clip=t.grad_clip if t.grad_clip > 0 else None, seed=t.seed)  # fmt: skip
    data = DataSpec(kind=d.kind, seed=d.seed, path=d.path, dtype=d.dtype, region=d.region)
    return Slice(model=model_config(spec.model), data=data, training=training, local_batch=batch, every=h,
                 steps=max(h, min(t.steps, rounds * h)), regions=regions, heldout_batches=heldout_batches,
                 outer_lr=spec.sync.outer_lr, outer_momentum=spec.sync.outer_momentum)  # fmt: skip
