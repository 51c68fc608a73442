"""The intra-cluster train loop: model, data, optimizer and parallelism built from a WorkerConfig,
then steps, each followed by the cross-region hook (``training.sync_hook``)."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from contracts.errors import InvalidArgument
from contracts.worker_config import WorkerConfig
from training.byo import DatasetStream, build_byo
from training.checkpoint import BackgroundSaver, agreed_checkpoint, load_checkpoint
from training.checkpoint_schedule import PeriodicCheckpoints
from training.data.markov import MarkovSource
from training.data.prefetch import Prefetched
from training.data.streams import BatchStream, build_stream, derive_seed
from training.exchange_totals import ExchangeTotals
from training.metrics import MetricsCallback
from training.models.gpt import lm_loss
from training.parallel.dims import ParallelDims
from training.parallel.init import DistContext
from training.parallel.parallelize import parallelize
from training.parallel.pipeline import build_schedule
from training.parallel.replica_state import (
    gather_full_grads,
    gather_full_params,
    gather_stage_grads,
    gather_stage_params,
    replica_layout,
    scatter_full_grads,
    scatter_full_params,
    scatter_stage_grads,
    scatter_stage_params,
    stage_groups,
    stage_layout,
)
from training.preemption import PreemptWatch
from training.step import ForwardLoss, build_gpt_stage, build_optimizer, clip_grad_norm, forward_backward
from training.sync.stages import merge_stage_metrics, merge_stage_totals, stage_sync_config
from training.sync_hook import build_sync, other_regions
from training.sync_protocol import CrossRegionSync, SyncContext

if TYPE_CHECKING:  # pipelining imports dynamo: loaded where a pipeline is built
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

STEP_PART_KEYS = ("data_s", "compute_s", "optimizer_s", "sync_s", "checkpoint_s", "wall_s")


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup, then cosine decay to ``min_ratio`` of the peak at ``total`` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class Trainer:
    cfg: WorkerConfig
    ctx: DistContext
    dims: ParallelDims
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: BatchStream
    forward_loss: ForwardLoss
    sync: CrossRegionSync
    schedule: PipelineScheduleSingle | None = None
    entropy_floor: float | None = None
    tokens_per_sample: int = 1  # the GPT's seq_len; a BYO sample counts as one
    step: int = 0  # optimizer steps completed
    history: list[float] = field(default_factory=list)
    checkpoint_step: int | None = None  # the latest complete checkpoint this run wrote or resumed
    saver: BackgroundSaver | None = None
    first_step: int = 1  # the first step this process runs: it meets the peers there
    exchanged: bool = False  # whether the last step exchanged with the other regions
    sync_metrics_at: float = -math.inf  # monotonic: when the leader last took the sync engine's metrics
    preempt: PreemptWatch = field(default_factory=lambda: PreemptWatch(None))
    stop_asked: bool = False  # some rank was asked to stop (preemption), learnt at the last step
    preempted: bool = False  # the run stopped early on that request, after checkpointing
    # Per-stage sync (``training.sync.stages``): this rank's engine is its stage's, whose leader is
    # the stage's first rank; ``stage_group`` holds the stage's ranks (None: the stage is one rank).
    per_stage: bool = False
    stage_group: dist.ProcessGroup | None = None
    eval_dataset: Any = None  # a bring-your-own job's held-out data (``training.outputs``)

    @property
    def sync_leader(self) -> bool:
        """Whether this rank's engine talks to peers: the job's leader, or its stage's."""
        if self.per_stage:
            return self.ctx.rank == self.dims.stage_leader(self.dims.pp_rank)
        return self.ctx.is_leader

    def _gather_grads(self) -> list[Tensor]:
        if self.per_stage:
            return gather_stage_grads(self.model, self.dims)
        return gather_full_grads(self.model, self.dims)

    def _scatter_grads(self, grads: list[Tensor]) -> None:
        if self.per_stage:
            scatter_stage_grads(self.model, self.dims, grads, self.stage_group)
        else:
            scatter_full_grads(self.model, self.dims, grads)

    def _gather_params(self) -> list[Tensor]:
        if self.per_stage:
            return gather_stage_params(self.model, self.dims)
        return gather_full_params(self.model, self.dims)

    def _scatter_params(self, params: list[Tensor]) -> None:
        if self.per_stage:
            scatter_stage_params(self.model, self.dims, params, self.stage_group)
        else:
            scatter_full_params(self.model, self.dims, params)

    def _gather_to_leader(self, mine: Any) -> list[Any]:
        """Collective: every rank's ``mine`` on global rank 0, in rank order (``[]`` elsewhere)."""
        out: list[Any] | None = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
        dist.gather_object(mine, out, dst=0)
        return out or []

    def _stage_parts(self, mine: Any) -> list[Any]:
        """Collective: each stage leader's ``mine`` on global rank 0, in stage order."""
        everyone = self._gather_to_leader(mine if self.sync_leader else None)
        return [everyone[self.dims.stage_leader(s)] for s in range(self.dims.pp)] if everyone else []

    def sync_totals(self) -> dict[str, Any]:
        """Collective in per-stage sync: the run's WAN byte totals, every stage's engine's added up
        (on global rank 0); else this rank's engine's."""
        if not self.per_stage:
            return self.sync.totals()
        return merge_stage_totals(self._stage_parts(self.sync.totals()))

    @property
    def bf16(self) -> bool:
        return self.cfg.training.precision == "bf16"

    def _forward_backward(self, x: Any, y: Any) -> Tensor:
        return forward_backward(
            self.model, self.schedule, self.dims, self.cfg, self.forward_loss, x, y, self.ctx.device
        )

    def _cluster_loss(self, local: Tensor) -> float:
        """Mean over this cluster's replicas: only last-stage ranks hold a loss (tp ranks equal).
        The same all-reduce tells every rank whether any was asked to stop (``training.preemption``)."""
        t = local.detach().float().reshape(())
        asked = self.preempt.asked()
        if self.ctx.world_size > 1:  # alone, gloo's all-reduce still hands off to its thread and back
            both = torch.stack([t, torch.tensor(float(asked), device=t.device)])
            dist.all_reduce(both)
            t, asked = both[0], bool(both[1] > 0)
        self.stop_asked = asked
        return float(t) / (self.dims.dp * self.dims.tp)

    def train_step(self) -> dict[str, Any]:
        step = self.step + 1
        t0 = time.perf_counter()
        x, y = self.stream.batch(step, self.cfg.local_batch)
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        t1 = time.perf_counter()
        local_loss = self._forward_backward(x, y)
        grad_sync_s = 0.0
        exchanged = self.sync.syncs_gradients(step)
        if exchanged:  # synchronous mode: one gradient for every region
            tg = time.perf_counter()
            grads = self._gather_grads()
            self.sync.reduce_gradients(step, grads)
            self._scatter_grads(grads)
            grad_sync_s = time.perf_counter() - tg
        grad_norm = None
        if self.cfg.training.grad_clip is not None:
            grad_norm = clip_grad_norm(list(self.model.parameters()), self.cfg.training.grad_clip, self.dims)
        lr = self.optimizer.param_groups[0]["lr"]
        self._device_sync()
        t_opt = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if (job_step := self.sync.job_step(step)) != step:
            self._set_lr(job_step)  # balanced rounds: the schedule follows the job's progress
        self._device_sync()
        t_opt_end = time.perf_counter()
        loss = self._cluster_loss(local_loss)  # also the point where the step's compute has finished
        t2 = time.perf_counter()
        # A process that starts mid-run (resumed, or a replacement) joins its peers at once; a
        # fresh one at its first event (step 1 for every engine).
        joining = step == self.first_step
        if self.sync.should_sync(step) or (joining and step > 1):
            exchanged = True
            params = self._gather_params()
            self.sync.after_step(step, params)
            self._scatter_params(params)
            if joining:
                step = self._catch_up(step)
        t3 = time.perf_counter()
        self.step, self.exchanged = step, exchanged
        self.history.append(loss)
        samples = self.cfg.local_batch * self.dims.dp
        tokens = samples * self.tokens_per_sample
        m: dict[str, Any] = {
            "job_id": self.cfg.job_id,
            "region": self.cfg.region,
            "cluster": self.cfg.cluster,
            "step": step,
            "loss": loss,
            "lr": lr,
            "tokens": tokens,
            "tokens_per_s": tokens / (t3 - t0),
            "samples_per_s": samples / (t3 - t0),
            "data_s": t1 - t0,
            "compute_s": (t2 - t1) - (t_opt_end - t_opt) - grad_sync_s,
            "optimizer_s": t_opt_end - t_opt,
            "sync_s": t3 - t2 + grad_sync_s,
            "wall_s": t3 - t0,
            "compute_util": (t2 - t1 - grad_sync_s) / (t3 - t0),
            "precision": self.cfg.training.precision,
        }
        if job_step != step:  # balanced rounds: this region's step count is its own
            m["job_step"] = job_step
        if grad_norm is not None:
            m["grad_norm"] = float(grad_norm)
        self._poll_checkpoint()
        if self.checkpoint_step is not None:
            m["checkpoint_step"] = self.checkpoint_step
        if self.entropy_floor is not None:
            m["entropy_floor"] = self.entropy_floor
        if self.per_stage:
            # Every stage's engine reports on its stage leader; merged on the job's leader after
            # each step that exchanged (every rank knows which those are), so no ring's bytes or
            # events are left out and no step is held up by a gather when nothing crossed a link.
            sync_metrics = merge_stage_metrics(self._stage_parts(self.sync.metrics())) if exchanged else {}
            if sync_metrics:
                m["sync"] = sync_metrics
        elif self.ctx.is_leader and self._sync_metrics_due(exchanged):
            sync_metrics = self.sync.metrics()
            if sync_metrics:
                m["sync"] = sync_metrics
                if "gossip_spread" in sync_metrics:  # top level: the job page plots it over time
                    m["gossip_spread"] = sync_metrics["gossip_spread"]
        return m

    def _device_sync(self) -> None:
        """Wait for queued device work so a timed span holds its own kernels (CUDA is asynchronous)."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def _catch_up(self, step: int) -> int:
        """After the first exchange: if the leader took a peer's state from further on, the whole
        cluster moves on to that peer's step, so its rounds and its end line up with the others'."""
        ahead = getattr(self.sync, "caught_up_step", 0) if self.sync_leader else 0
        t = torch.tensor([ahead], dtype=torch.int64, device=self.ctx.device)
        if self.per_stage:  # every stage leader caught up on its own ring: the furthest counts
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        else:
            dist.broadcast(t, src=0)  # global rank 0 is the leader
        ahead = min(int(t.item()), self.cfg.training.steps - 1)  # the last step (its final sync) is ours
        if ahead <= step:
            return step
        self._set_schedule(ahead)
        return ahead

    def _set_schedule(self, step: int) -> None:
        """The LR schedule where it is at ``step`` (no optimizer step is replayed)."""
        self._set_lr(step)
        self.scheduler.last_epoch = step

    def _set_lr(self, at: float) -> None:
        """The learning rate the schedule gives at (fractional) step ``at``."""
        sched = self.scheduler
        lrs = [base * f(at) for base, f in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        sched._last_lr = lrs

    def save(self, wait: bool = True) -> None:
        """Checkpoint this step. With ``wait=False`` the writing overlaps the next steps (it is
        reported as complete once it is); the run's last checkpoint is waited for."""
        ck = self.cfg.checkpoint
        if ck.dir is None:
            return
        extra = {  # copies: the saver keeps them while training goes on
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "sync": self._sync_state(),
        }
        if self.saver is None:
            self.saver = BackgroundSaver(ck.keep_last, spans_nodes=self.cfg.group is not None)
        self.saver.save(ck.dir, self.step, self.model, self.optimizer, extra)
        if wait:
            self.checkpoint_step = self.saver.wait()

    def _sync_state(self) -> dict[str, Any]:
        """The engine's state for a checkpoint (on the leader, which writes the metadata); in
        per-stage sync every stage's engine's, by stage (collective)."""
        if not self.per_stage:
            return self.sync.state_dict() if self.ctx.is_leader else {}
        parts = self._stage_parts(self.sync.state_dict())
        return {"stages": dict(enumerate(parts))} if parts else {}

    def _load_sync_state(self, state: dict[str, Any]) -> None:
        """Every rank reads the metadata: each engine that talks to peers takes its own part."""
        if not self.sync_leader:
            return
        if self.per_stage:
            self.sync.load_state_dict((state.get("stages") or {}).get(self.dims.pp_rank, {}))
        else:
            self.sync.load_state_dict(state)

    def _poll_checkpoint(self) -> None:
        if self.saver is not None and (done := self.saver.poll()) is not None:
            self.checkpoint_step = done

    def maybe_resume(self) -> bool:
        """From the latest complete checkpoint every rank's dir holds; else, with ``start_step``,
        begin at that step (fresh optimizer state, the LR schedule where it would be) and take the
        model from the peers at the first exchange. True when the run does not start at step 0."""
        ck = self.cfg.checkpoint
        path = None
        if ck.dir is not None and ck.resume:
            layout = None
            if self.cfg.group is not None:
                # A group spanning nodes: its saver knows the nodes, and resuming may send a node
                # the checkpoint it lacks.
                self.saver = self.saver or BackgroundSaver(ck.keep_last, spans_nodes=True)
                layout = self.saver.layout
            path = agreed_checkpoint(ck.dir, ck.resume_at_most, layout)
        if path is not None:
            meta = load_checkpoint(path, self.model, self.optimizer)
            self.scheduler.load_state_dict(meta["scheduler"])
            self.step = int(meta["step"])
            self.checkpoint_step = self.step
            self._load_sync_state(meta.get("sync", {}))
        elif ck.start_step:
            self.step = min(ck.start_step, self.cfg.training.steps)
            self._set_schedule(self.step)
        self.first_step = self.step + 1
        return self.step > 0

    def _sync_metrics_due(self, exchanged: bool) -> bool:
        """Whether this step takes the sync engine's metrics: after every step that exchanged (its
        bytes and the kernel's wire counters are read while the connections are up), else at most
        once per ``metrics_interval_s``, the rate the worker reports at (0: every step). Each take
        returns what happened since the one before, so its totals are the same; taking them every
        step cost the leader ~0.4 ms a step (0.2 s of a 100 s loop on a loaded 2-core host)."""
        now = time.monotonic()
        if exchanged or now - self.sync_metrics_at >= self.cfg.metrics_interval_s:
            self.sync_metrics_at = now
            return True
        return False

    def run(
        self,
        callback: MetricsCallback | None = None,
        spawned_at: float | None = None,
        started_at: float | None = None,
    ) -> dict[str, Any]:
        """Train to the configured step count. ``spawned_at`` (unix seconds): when the node started
        this worker's launcher, so the result can say how long start-up took; ``started_at``: when
        this worker process started, so it can say how much of that was the launcher's."""
        start, t0, first_at = self.step, time.perf_counter(), time.time()
        every, planned = self.cfg.checkpoint.every, self.cfg.training.steps
        totals: dict[str, float] = {}
        exchanges = ExchangeTotals()
        first: dict[str, float] | None = None
        final: dict[str, Any] = {}
        delay = None  # steps the last overlapped round took to land (on arrival: as its exchange took)
        # Periodic checkpoints follow the job's progress (balanced rounds: the same point of each
        # round in every region; ``training.checkpoint_schedule``).
        periodic_at = PeriodicCheckpoints(every or 0, self.sync.job_step(self.step))
        # Balanced rounds (``training.sync.algorithms.round_plan``) give each region its own step
        # count, known for certain only once its last round is planned: asked after every step.
        while self.step < (last := self.sync.local_steps(planned)):
            m = self.train_step()
            last = self.sync.local_steps(planned)
            delay = (m.get("sync") or {}).get("overlap_steps", delay)
            exchanges.add(m, exchanged=self.exchanged, joining=self.step == self.first_step)
            periodic = periodic_at.due(self.sync.job_step(self.step)) and self.step < last
            # Preempted: this step is checkpointed and the run ends here (the last step ends anyway).
            stop = self.stop_asked and self.step < last
            if self.cfg.checkpoint.dir is not None and (periodic or stop or self.step == last):
                t_save = time.perf_counter()
                self.save(wait=stop or self.step == last)
                if stop:
                    m["checkpoint_step"] = self.checkpoint_step
                m["checkpoint_s"] = time.perf_counter() - t_save
                m["wall_s"] += m["checkpoint_s"]
            if callback is not None and self.ctx.is_leader:
                callback(m)
            for key in STEP_PART_KEYS:
                totals[key] = totals.get(key, 0.0) + m.get(key, 0.0)
            if first is None:
                first = {key: m.get(key, 0.0) for key in STEP_PART_KEYS}
            final = m
            if stop:
                self.preempted = True
                break
        train_s = time.perf_counter() - t0
        # Totals over the run: the agent forwards per-step metrics at a bounded rate, so a sampled
        # step says little about parts that come every H steps (sync, checkpoints).
        # The first step waits for every peer to be up (its first exchange), which is start-up, not
        # the loop's steady state: kept apart so utilisation can be read without it.
        # The last step holds the final blocking exchange (and any wait for slower regions) and the
        # final checkpoint: kept apart too, to tell them from the costs spread over the run.
        timing: dict[str, Any] = {
            "train_s": train_s,
            "parts_total_s": totals,
            "first_step_s": first or {},
            "last_step_s": {key: final.get(key, 0.0) for key in STEP_PART_KEYS} if final else {},
        }
        if exchanges.n:
            timing["exchange_totals"] = exchanges.as_dict()
        if delay is not None:
            timing["overlap_steps"] = delay
        if spawned_at is not None:
            timing["startup_s"] = max(0.0, first_at - spawned_at)
            if started_at is not None:
                # The launcher's part: the node spawned it until it started this worker.
                timing["launcher_s"] = min(max(0.0, started_at - spawned_at), timing["startup_s"])
        return {
            **timing,
            "job_id": self.cfg.job_id,
            "region": self.cfg.region,
            "cluster": self.cfg.cluster,
            "steps": self.step,
            "resumed_from": start or None,
            "checkpoint_step": self.checkpoint_step,
            "final_loss": self.history[-1] if self.history else None,
            "entropy_floor": self.entropy_floor,
            "wall_s": time.perf_counter() - t0,
            "precision": self.cfg.training.precision,
            "activation_checkpointing": self.cfg.training.activation_checkpointing,
        } | ({"preempted": True} if self.preempted else {})

    def close(self) -> None:
        if self.saver is not None:
            self.saver.close()
        if isinstance(self.stream, Prefetched):
            self.stream.close()
        self.sync.close()


def _gpt_forward_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return model(x, y)[1]


def build_trainer(cfg: WorkerConfig, ctx: DistContext) -> Trainer:
    p = cfg.parallel
    dims = ParallelDims(
        dp=p.dp_local,
        tp=p.tp,
        pp=p.pp,
        world_size=ctx.world_size,
        zero=p.zero,
        pp_schedule=p.pp_schedule,
        microbatches=cfg.microbatches,
    )
    dims.build_mesh(ctx.device.type)
    replica = cfg.replica_offset + dims.dp_rank
    floor = None
    eval_dataset = None
    if cfg.entrypoint is not None:
        if dims.tp > 1 or dims.pp > 1:
            raise InvalidArgument(
                "a bring-your-own model supports data parallelism only (tp = pp = 1)", field="parallel"
            )
        job = build_byo(cfg)
        model: nn.Module = job.model
        loss_fn = job.loss_fn
        eval_dataset = job.eval_dataset
        forward_loss: ForwardLoss = lambda m, x, y: loss_fn(m(x), y)  # noqa: E731
        stream: BatchStream = DatasetStream(
            job.dataset, cfg.data.seed, replica, cfg.global_replicas, cfg.local_batch
        )
    else:
        assert cfg.model is not None
        model = build_gpt_stage(cfg, dims)
        forward_loss = _gpt_forward_loss
        stream = build_stream(
            cfg.data,
            worker_region=cfg.region,
            vocab=cfg.model.vocab,
            seq_len=cfg.model.seq_len,
            replica=replica,
            replicas=cfg.global_replicas,
        )
        if cfg.data.kind == "synthetic-markov":
            floor = MarkovSource(
                cfg.model.vocab,
                cfg.data.seed,
                min(cfg.data.branching, cfg.model.vocab),
                cfg.data.concentration,
            ).entropy_rate_nats
    # Dropout masks: one stream per replica, shared by its TP ranks (whose activations are replicas).
    torch.manual_seed(derive_seed(cfg.training.seed, replica))
    if ctx.device.type == "cuda":  # a CPU slot's cores are its compute's: no thread beside it
        stream = Prefetched(stream)
    model.to(ctx.device)
    model = parallelize(model, dims)
    schedule = build_schedule(model, dims, ctx.device, lm_loss) if dims.pp > 1 else None
    optimizer = build_optimizer(model, cfg)
    t = cfg.training
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, t.warmup, t.steps, t.min_lr_ratio)
    )
    layout = replica_layout(model, dims)
    # Per-stage sync: this rank's engine is its stage's, led by the stage's first rank.
    per_stage = bool(cfg.sync.stages) and cfg.sync.mode != "none" and bool(other_regions(cfg))
    sync_cfg, group, leads = cfg, None, ctx.is_leader
    if per_stage:
        groups = stage_groups(dims)  # every rank creates every stage's group
        group = groups[dims.pp_rank]
        leads = ctx.rank == dims.stage_leader(dims.pp_rank)
        layout = stage_layout(model, dims, dims.pp_rank)
        sync_cfg = cfg.model_copy(update={"sync": stage_sync_config(cfg.sync, dims.pp_rank, leads=leads)})
    sync_ctx = SyncContext(
        job_id=cfg.job_id,
        region=cfg.region,
        cluster=cfg.cluster,
        is_leader=leads,
        rank=ctx.rank,
        world_size=ctx.world_size,
        local_replicas=dims.dp,
        global_replicas=cfg.global_replicas,
        replica_offset=cfg.replica_offset,
        param_names=tuple(i.name for i in layout),
        param_shapes=tuple(i.shape for i in layout),
    )
    return Trainer(
        cfg=cfg,
        ctx=ctx,
        dims=dims,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        stream=stream,
        forward_loss=forward_loss,
        sync=build_sync(sync_cfg, sync_ctx),
        per_stage=per_stage,
        stage_group=group,
        schedule=schedule,
        entropy_floor=floor,
        tokens_per_sample=cfg.model.seq_len if cfg.model is not None and cfg.entrypoint is None else 1,
        preempt=PreemptWatch(cfg.preempt_file),
        eval_dataset=eval_dataset,
    )
