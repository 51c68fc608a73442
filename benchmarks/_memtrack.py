"""What one rank of a training job holds in memory, measured by torch's own accounting.

``measure(layout)`` builds the module and parallel layout the worker builds for that rank (the
same functions: ``training.step.build_gpt_stage``, ``parallelize`` with its TP plan, FSDP2 or DDP,
``build_schedule`` for a pipeline stage, ``build_optimizer``) and runs two of the worker's steps
(``training.step.forward_backward`` over the micro-batches under autocast, ``clip_grad_norm``, the
optimizer step) under ``torch.distributed._tools.mem_tracker.MemTracker``. Tensors are fake
(``FakeTensorMode``): shapes and storages without memory, so a model of any size costs the same.
The process stands in for one rank of a larger world through torch's fake process group, whose
collectives move nothing. The first step creates the optimizer state and every lazily built
buffer; the second, on the whole local batch, is the one measured.

It shares no code with the planner's memory model (``control_layer/planner/memory_model.py``),
which it checks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import _StageMeta, extract_tensor_metas
from torch.distributed.pipelining.schedules import PipelineScheduleSingle
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.distributed.fake_pg import FakeStore

from contracts.model import GPTConfig
from contracts.worker_config import WorkerConfig
from training.models.gpt import lm_loss
from training.parallel.dims import ParallelDims
from training.parallel.parallelize import parallelize
from training.parallel.pipeline import build_schedule
from training.runtime import _gpt_forward_loss
from training.step import build_gpt_stage, build_optimizer, clip_grad_norm, forward_backward

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Layout:
    """One rank's share of a job: the model, the degrees of its torchrun group (``dp_local``
    replicas of ``tp`` x ``pp`` devices), the batch it steps on and which pipeline stage it is."""

    model: GPTConfig
    tp: int = 1
    pp: int = 1
    zero: int = 0
    dp_local: int = 1
    micro_batch: int = 1  # sequences per micro-batch
    microbatches: int = 1  # micro-batches per step: accumulated, or the pipeline's
    precision: str = "fp32"
    activation_checkpointing: bool = False
    pp_schedule: str = "1f1b"
    grad_clip: float | None = 1.0
    stage: int = 0

    def worker_config(self) -> WorkerConfig:
        """The config the control plane would hand this rank's worker."""
        return WorkerConfig.model_validate(
            {
                "job_id": "memtrack",
                "region": "r",
                "cluster": "c",
                "model": self.model.model_dump(),
                "training": {
                    "steps": 2,
                    "local_batch": self.micro_batch * self.microbatches,
                    "micro_batch": self.micro_batch if self.pp == 1 else None,
                    "precision": self.precision,
                    "activation_checkpointing": self.activation_checkpointing,
                    "grad_clip": self.grad_clip,
                },
                "parallel": {
                    "dp_local": self.dp_local,
                    "tp": self.tp,
                    "pp": self.pp,
                    "zero": self.zero,
                    "pp_schedule": self.pp_schedule,
                    "microbatches": self.microbatches if self.pp > 1 else None,
                },
            }
        )


@dataclass(frozen=True)
class Measured:
    """Bytes on the rank, by MemTracker. Between steps it holds ``weights`` (parameters),
    ``optimizer`` (optimizer state) and ``buffers`` (the rest: DDP's gradient buckets, a pipeline
    stage's receive buffers); ``grads`` is what a step adds by the time the optimizer runs beyond
    its batch of token ids, and ``peak`` the most the step holds at any moment."""

    weights: int
    optimizer: int
    buffers: int
    grads: int
    peak: int

    @property
    def between_steps(self) -> int:
        return self.weights + self.optimizer + self.buffers

    @property
    def activations(self) -> int:
        """What the step holds at its peak beyond what stays between steps."""
        return self.peak - self.between_steps


class _StepTracker(MemTracker):
    """MemTracker for whole training steps.

    The worker runs its model once per micro-batch; MemTracker takes a second forward of the root
    module for a new iteration and refuses it, so each one starts the module statistics afresh
    (``reset_mod_stats``; the tensors tracked stay tracked). Only the global peak is read, so the
    per-module peaks, which cost a pass over every module per operator, are not kept."""

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        again = module in self.memory_tracking and not self._mod_tracker.is_bw
        if again and set(self._mod_tracker.parents) - {name} == {"Global"}:
            self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    def current(self) -> dict[str, int]:
        return _by_name(self.get_tracker_snapshot("current"))

    def peak(self) -> int:
        return _by_name(self.get_tracker_snapshot("peak")).get("Total", 0)


def _by_name(snapshot: dict[torch.device, dict[Any, int]]) -> dict[str, int]:
    return {getattr(k, "value", k): v for k, v in snapshot.get(CPU, {}).items()}


def _bucket_as_reduced(_state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the bare signature
    """DDP's all-reduce as the fake group runs it: in place, so the bucket is its own result (the
    fake group's future carries no tensor, which DDP's default hook would hand back)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


@contextlib.contextmanager
def _fake_world(rank: int, world_size: int) -> Iterator[None]:
    """One process as rank ``rank`` of ``world_size`` over torch's fake process group.

    Two spots of torch behave differently under the harness's fake mode than on real tensors,
    and are put back as they run there. DeviceMesh finds a rank's coordinates with ``nonzero`` on
    its rank table, a value fake tensors do not have: the table is real and tiny, so that runs
    outside fake mode. DTensor works out an op's output shape by running it on fake tensors of
    the whole (global) shape in the fake mode it finds active: on real tensors a mode of its own,
    which MemTracker ignores, but here the harness's, so MemTracker would count tensors that never
    exist; it is given a mode of its own."""
    mesh_init = DeviceMesh.__init__
    detect = sharding_prop.detect_fake_mode

    @functools.wraps(mesh_init)
    def real_mesh_init(self: DeviceMesh, *args: Any, **kwargs: Any) -> None:
        with unset_fake_temporarily():
            mesh_init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_mesh_init  # type: ignore[method-assign]
    sharding_prop.detect_fake_mode = lambda *a, **k: None
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        DeviceMesh.__init__ = mesh_init  # type: ignore[method-assign]
        sharding_prop.detect_fake_mode = detect


def _neighbours_shapes(schedule: PipelineScheduleSingle, dims: ParallelDims, cfg: WorkerConfig) -> None:
    """Tell the stage what its neighbours would: the shapes it receives and sends.

    A pipeline learns them at its first step by messages between the stages (a vote on whether
    every stage knows its shapes, then each stage's output shape passed down), which a single
    faked rank cannot hear. What they would say: token ids (micro-batch x sequence) into the first
    stage, the fp32 residual stream between stages, the logits out of the last (bf16 under
    autocast). With the shapes given, every stage votes "static" and allocates the same
    per-micro-batch receive buffers the exchange would have sized."""
    assert cfg.model is not None
    m = cfg.model
    mb = cfg.local_batch // cfg.microbatches
    hidden = torch.empty(mb, m.seq_len, m.d_model, requires_grad=True)
    first, last = dims.pp_rank == 0, dims.pp_rank == dims.pp - 1
    inputs = torch.empty(mb, m.seq_len, dtype=torch.long) if first else hidden
    logits_dtype = torch.bfloat16 if cfg.training.precision == "bf16" else torch.float32
    logits = torch.empty(mb, m.seq_len, m.vocab, dtype=logits_dtype, requires_grad=True)
    outputs = logits if last else hidden
    stage = schedule._stage
    stage._user_meta = _StageMeta(
        inputs=extract_tensor_metas((inputs,)), outputs=extract_tensor_metas((outputs,))
    )


@contextlib.contextmanager
def _static_vote() -> Iterator[None]:
    """The pipeline's warm-up vote, as every stage with known shapes answers it: static (the
    vote's messages carry nothing through the fake group)."""
    forward, backward = PipelineStage._warmup_forward_vote, PipelineStage._warmup_backward_result

    def agreed(*_args: Any, **_kwargs: Any) -> torch.Tensor:
        return torch.tensor([1], dtype=torch.int32)  # a literal: fake tensors keep its value

    PipelineStage._warmup_forward_vote = agreed  # type: ignore[method-assign]
    PipelineStage._warmup_backward_result = agreed  # type: ignore[method-assign]
    try:
        yield
    finally:
        PipelineStage._warmup_forward_vote = forward  # type: ignore[method-assign]
        PipelineStage._warmup_backward_result = backward  # type: ignore[method-assign]


def measure(layout: Layout, real: bool = False) -> Measured:
    """What the rank of ``layout`` holds between steps and at the peak of a step; on real tensors
    where ``real`` (small models only) or the layout uses DDP."""
    cfg = layout.worker_config()
    p = cfg.parallel
    world = p.dp_local * p.tp * p.pp
    dims = ParallelDims(
        dp=p.dp_local,
        tp=p.tp,
        pp=p.pp,
        world_size=world,
        zero=p.zero,
        pp_schedule=p.pp_schedule,
        microbatches=cfg.microbatches,
    )
    with _fake_world(dims.stage_leader(layout.stage), world), _static_vote():
        dims.build_mesh(CPU.type)  # its rank table is real: built before fake mode
        return _measure(dims, cfg, fake=not (real or uses_ddp(layout)))


def uses_ddp(layout: Layout) -> bool:
    """Whether the worker wraps this layout's model in DDP (``parallelize``): its measurement then
    runs on real tensors, since DDP's reducer reads bucket indices from tensor data on the second
    step, which fake tensors do not have; keep such layouts' models small."""
    return layout.zero == 0 and layout.tp == 1 and layout.dp_local > 1


def _measure(dims: ParallelDims, cfg: WorkerConfig, fake: bool) -> Measured:
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        tracker = _StepTracker()
        # Built on the CPU it is measured on, so the worker's ``model.to(device)`` has nothing to
        # move (and fake parameters cannot be swapped for moved copies).
        stage = build_gpt_stage(cfg, dims)
        tracker.track_external(stage)
        with tracker:
            model = parallelize(stage, dims)
            if isinstance(model, DDP):
                model.register_comm_hook(None, _bucket_as_reduced)
            schedule = None
            if dims.pp > 1:
                schedule = build_schedule(model, dims, CPU, lm_loss)
                _neighbours_shapes(schedule, dims, cfg)
            optimizer = build_optimizer(model, cfg)
            # The first step makes the optimizer state and every lazily built buffer. Without a
            # pipeline it runs on one micro-batch: what it leaves behind is the same.
            _step(
                model,
                schedule,
                optimizer,
                dims,
                cfg,
                sequences=cfg.local_batch if schedule else cfg.micro_batch,
            )
        tracker.reset_mod_stats()
        rest = tracker.current()
        with tracker:  # entering again starts the peak from what is held now
            at_step = _step(model, schedule, optimizer, dims, cfg, tracker)
        peak = tracker.peak()
    weights, optimizer_bytes = rest.get("Parameter", 0), rest.get("Optstate", 0)
    return Measured(
        weights=weights,
        optimizer=optimizer_bytes,
        buffers=rest.get("Total", 0) - weights - optimizer_bytes,
        grads=at_step - rest.get("Total", 0),
        peak=peak,
    )


def _step(
    model: nn.Module,
    schedule: Any,
    optimizer: torch.optim.Optimizer,
    dims: ParallelDims,
    cfg: WorkerConfig,
    tracker: _StepTracker | None = None,
    sequences: int | None = None,
) -> int:
    """One of the worker's steps (``Trainer.train_step`` without its data source, timing and
    cross-region hooks) on ``sequences`` (the local batch unless given). Returns the bytes held
    when the optimizer is about to step."""
    assert cfg.model is not None
    shape = (sequences or cfg.local_batch, cfg.model.seq_len)
    x = torch.randint(0, cfg.model.vocab, shape, device=CPU)
    y = torch.randint(0, cfg.model.vocab, shape, device=CPU)
    forward_backward(model, schedule, dims, cfg, _gpt_forward_loss, x, y, CPU)
    if cfg.training.grad_clip is not None:
        clip_grad_norm(list(model.parameters()), cfg.training.grad_clip, dims)
    held = tracker.current().get("Total", 0) - x.nbytes - y.nbytes if tracker is not None else 0
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return held
