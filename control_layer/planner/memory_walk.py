"""One training step's memory, walked moment by moment as the worker runs it.

Counts what a step holds beyond what stays between steps: the batch, the activations each block
keeps for backward, the loss's logits, FSDP's gathered parameters and flat buffers, gradients as
they appear, and the largest temporaries of the moments that peak (the loss's backward, a
block's MLP backward, the optimizer). docs/cost-model.md ("Memory") derives each term; the
figures were checked against torch's MemTracker on the worker's code (benchmarks/memory_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.model import GPTConfig
from control_layer.planner.memory_params import BF16, FP32, TOKEN_ID, Layout, StageParams, Unit


@dataclass
class Walk:
    """The bytes a step holds beyond what stays between steps, followed moment by moment."""

    now: float = 0.0
    peak: float = 0.0
    logits_at_peak: float = 0.0

    def add(self, nbytes: float) -> None:
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def spike(self, nbytes: float, logits: float = 0.0) -> None:
        """Held for a moment on top of what is held now."""
        if self.now + nbytes > self.peak:
            self.peak, self.logits_at_peak = self.now + nbytes, logits


@dataclass(frozen=True)
class Acts:
    """What one micro-batch's forward keeps for backward on one device, by part (bytes)."""

    stream: float  # a block's input: the fp32 residual stream, T·d
    block: float  # a block without checkpointing, beyond its input (its bf16 weight copies too)
    mlp: float  # the MLP's hidden activation, T·4d/tp at the matmuls' precision
    proj_grad: float  # the MLP output projection's weight gradient as backward first makes it
    head: float  # norm input, lm_head input (and its weight's bf16 copy), the log-probabilities
    log_probs: float  # T·V fp32
    logits: float  # the loss's inputs beside its kept output: the logits, and their fp32 copy
    casts: float  # a block's bf16 copies autocast keeps to the forward's end beyond those saved


def activations(cfg: GPTConfig, layout: Layout, block: Unit) -> Acts:
    t, d, v = layout.tp, cfg.d_model, cfg.vocab
    tokens = layout.micro_batch * cfg.seq_len
    half = layout.precision == "bf16"
    width = BF16 if half else FP32
    # Per block, at the matmuls' precision: q, k, v and the attention output (4 T·d/t), the MLP's
    # hidden layer before and after GELU (2 of T·4d/t); in fp32 the LayerNorm outputs the
    # matmuls read (2 T·d) and the residual after attention (T·d); under autocast their bf16
    # copies instead, one per matmul reading them (q, k, v, fc: 4 of T·d at 2 bytes), and every
    # weight's bf16 copy. Small: LayerNorm statistics (2 x 2 T fp32), attention log-sum-exp (T·h/t).
    per = (4 + 8) * tokens * d / t * width
    if half:
        per += FP32 * tokens * d + 4 * BF16 * tokens * d + BF16 * block.matmul
    else:
        per += 3 * FP32 * tokens * d
    per += 4 * FP32 * tokens + FP32 * tokens * cfg.n_heads / t
    head_in = FP32 * tokens * d + (BF16 * tokens * d + BF16 * v * d if half else FP32 * tokens * d)
    return Acts(
        stream=FP32 * tokens * d,
        block=per,
        mlp=tokens * 4 * d / t * width,
        proj_grad=4 * d * d / t * (BF16 if half else FP32),
        head=head_in + 2 * FP32 * tokens + FP32 * tokens * v,
        log_probs=FP32 * tokens * v,
        logits=(BF16 + FP32 if half else FP32) * tokens * v,
        # Autocast caches each weight's and bias's bf16 copy until the forward ends; the saved
        # ones (weights, without recomputation) are in ``block`` already.
        casts=BF16 * (block.bias + (block.matmul if layout.activation_checkpointing else 0)) if half else 0.0,
    )


class _Params:
    """What one device holds of its stage's parameters and gradients during a step, beyond what
    stays between steps, unit by unit as the worker's data parallelism moves them.

    Without FSDP the gradients land in ``.grad`` (DDP also copies them into its buckets, which
    stay between steps). FSDP2 gathers a unit's parameters (all-gather into one flat buffer, then
    copied out into the padded whole tensors), keeps them to the end of backward (ZeRO-3 frees a
    block's after its forward and gathers it again, with the next one prefetched, for its
    backward), and after the unit's backward reduce-scatters its gradients (copied into one flat
    buffer, which stays until the next unit's reduction) into the shard it keeps, freeing the
    whole ones and the gathered parameters. Micro-batches that do not synchronise keep the
    whole gradients instead, accumulated in place."""

    def __init__(self, walk: Walk, layout: Layout) -> None:
        self.walk, self.layout = walk, layout
        self.gathered: set[int] = set()
        self.whole_grads: dict[int, float] = {}  # FSDP units' whole gradients of this pass
        self.accumulated: dict[int, float] = {}  # those a no-sync pass kept, by unit
        self.reduced: set[int] = set()  # FSDP units whose sharded gradients exist
        self.buffer = 0.0  # the last reduce-scatter's input, held until the next reduction
        self.flat = 0.0  # the last forward all-gather's flat buffer
        self.prefetched: set[int] = set()

    def whole(self, unit: Unit) -> float:
        return FP32 * self.layout.shards * unit.shard

    def gather(self, key: int, unit: Unit, forward: bool = True) -> None:
        """FSDP's all-gather of a unit: into one flat buffer, then copied out into the whole
        tensors. In forward the flat buffer stays until the next unit has been copied out (or
        the forward, which takes in the loss, ends); in backward it is freed at once, and the
        next unit's (prefetched) is already held. Over a shard group of one it copies straight."""
        if not self.layout.fsdp or key in self.gathered:
            return
        whole = self.whole(unit)
        if self.layout.shards > 1:
            if key not in self.prefetched:
                self.walk.add(whole)
            self.prefetched.discard(key)
            self.walk.add(whole)
            self.walk.add(-self.flat)  # the previous unit's, freed once this one is copied out
            self.flat = 0.0
            if forward:
                self.flat = whole
            else:
                self.walk.add(-whole)
        else:
            self.walk.add(whole)
        self.gathered.add(key)

    def prefetch(self, key: int, unit: Unit) -> None:
        """ZeRO-3's backward starts the next unit's all-gather while this one runs."""
        if self.layout.shards > 1 and key not in self.gathered and key not in self.prefetched:
            self.walk.add(self.whole(unit))
            self.prefetched.add(key)

    def end_forward(self) -> None:
        self.walk.add(-self.flat)
        self.flat = 0.0

    def free(self, key: int, unit: Unit) -> None:
        if key in self.gathered:
            self.gathered.discard(key)
            self.walk.add(-self.whole(unit))

    def grads(self, key: int, part: Unit, first: bool) -> None:
        """Gradients of ``part`` (of unit ``key``) appear: into ``.grad`` (added in place after
        the first micro-batch), or FSDP's whole gradients (added into the ones a no-sync pass
        kept)."""
        fresh = FP32 * part.local
        if not self.layout.fsdp and not first:
            self.walk.spike(FP32 * part.largest)  # one tensor's at a time, added as it appears
            return
        if key in self.accumulated:
            self.walk.spike(fresh)  # FSDP adds a unit's whole gradients after its backward
            return
        self.walk.add(fresh)
        if self.layout.fsdp:
            self.whole_grads[key] = self.whole_grads.get(key, 0.0) + fresh

    def reduce(self, key: int, unit: Unit, sync: bool, reshard: bool = True) -> None:
        """FSDP's step after a unit's backward: reduce-scatter (or keep, without sync) its
        gradients, and free its gathered parameters (a pipeline keeps them to its last)."""
        if not self.layout.fsdp:
            return
        walk = self.walk
        if not sync:
            if key in self.whole_grads:
                self.accumulated[key] = self.whole_grads.pop(key)
            if reshard:
                self.free(key, unit)
            return
        fresh = self.whole_grads.pop(key, 0.0) + self.accumulated.pop(key, 0.0)
        if reshard:
            self.free(key, unit)  # before the reduction: the gradients were set aside
        walk.add(self.whole(unit) - self.buffer)  # the reduce-scatter input; the last one freed
        walk.add(-fresh)
        self.buffer = self.whole(unit)
        if key not in self.reduced:
            walk.add(FP32 * unit.shard)
            self.reduced.add(key)
        self.free(key, unit)

    def end_backward(self) -> None:
        self.walk.add(-self.buffer)
        self.buffer = 0.0


def local_step(cfg: GPTConfig, layout: Layout, sp: StageParams, every_micro_batch: bool = False) -> Walk:
    """One step of a whole replica (no pipeline): the micro-batches one after another, each
    forward then backward, the gradients reduced on the last; then the optimizer.

    The micro-batches between the second and the last repeat the second exactly, so only the
    first, the second and the last are walked (``every_micro_batch`` walks them all)."""
    walk = Walk()
    acts = activations(cfg, layout, sp.blocks[0])
    params = _Params(walk, layout)
    walk.add(2 * TOKEN_ID * layout.micro_batch * cfg.seq_len * layout.n_micro)  # inputs, targets
    root, blocks = sp.root, sp.blocks
    recompute = layout.activation_checkpointing
    n = layout.n_micro
    for micro in range(n) if every_micro_batch else sorted({0, min(1, n - 1), n - 1}):
        sync = micro == n - 1
        params.gather(-1, root)
        for i, block in enumerate(blocks):
            params.gather(i, block)
            walk.add(acts.stream + acts.casts + (0.0 if recompute else acts.block))
            if layout.reshard_after_forward:
                params.free(i, block)
        walk.add(acts.head)
        # The loss. Forward: the logits, their fp32 copy under autocast, and log-softmax's output
        # (kept) at once, FSDP's last flat all-gather buffer still held. Backward: the
        # gradient in and out of log-softmax beside its output.
        walk.spike(acts.logits, logits=acts.logits + acts.log_probs)
        params.end_forward()
        walk.add(-acts.casts * len(blocks))
        if layout.reshard_after_forward:
            # ZeRO-3 frees the root's parameters with the forward (which takes in the loss) and
            # gathers them again as backward starts, prefetching the last block's.
            params.free(-1, root)
            params.gather(-1, root, forward=False)
            params.prefetch(len(blocks) - 1, blocks[-1])
        walk.spike(2 * acts.log_probs, logits=3 * acts.log_probs)
        walk.add(-acts.head + acts.stream)  # the head's backward leaves the residual's gradient
        params.grads(-1, sp.head, first=micro == 0)
        for i in reversed(range(len(blocks))):
            block = blocks[i]
            params.gather(i, block, forward=False)
            if i > 0 and layout.reshard_after_forward:
                params.prefetch(i - 1, blocks[i - 1])
            if recompute:
                walk.add(acts.block)
            # The MLP's backward: the gradient of its hidden layer twice (through GELU) and the
            # output projection's weight gradient, with the block's activations still held.
            walk.spike(acts.mlp + acts.proj_grad)
            walk.add(-acts.block - acts.stream)  # its input's gradient replaces its output's
            params.grads(i, block, first=micro == 0)
            params.reduce(i, block, sync)
        params.grads(-1, sp.embed, first=micro == 0)
        walk.add(-acts.stream)
        params.reduce(-1, root, sync)
        params.end_backward()
    walk.spike(FP32 * sp.optimizer_temp)
    return walk


def schedule_order(n_micro: int, pp: int, stage: int, schedule: str) -> list[str]:
    """The forwards ("F") and backwards ("B") a stage runs in one step: GPipe all forwards then
    all backwards; 1F1B ``pp - stage`` forwards to fill the pipeline, then one backward and one
    forward in turn (``torch.distributed.pipelining``)."""
    if schedule == "gpipe":
        return ["F"] * n_micro + ["B"] * n_micro
    warm = min(n_micro, pp - stage)
    order, forwards = ["F"] * warm, warm
    for _ in range(n_micro):
        order.append("B")
        if forwards < n_micro:
            order.append("F")
            forwards += 1
    return order


def pipeline_step(
    cfg: GPTConfig, layout: Layout, sp: StageParams, stage: int, every_micro_batch: bool = False
) -> Walk:
    """One step of a pipeline stage, its schedule's forwards and backwards in order, all under
    one autocast (so the bf16 copies of the stage's weights live the whole step), FSDP's
    gradients kept whole and reduced once after the last backward; then the optimizer.

    A long schedule repeats itself: 1F1B's steady state after three rounds, GPipe's backwards
    after the third (its forwards only add up, so the others' activations are added at once).
    So at most the pipeline's fill and three more micro-batches are walked
    (``every_micro_batch`` walks them all)."""
    walk = Walk()
    acts = activations(cfg, layout, sp.blocks[0])
    params = _Params(walk, layout)
    first, last = stage == 0, stage == layout.pp - 1
    half = layout.precision == "bf16"
    recompute = layout.activation_checkpointing
    walk.add(2 * TOKEN_ID * layout.micro_batch * cfg.seq_len * layout.n_micro)  # inputs, targets
    cache = BF16 * sum(u.matmul + u.bias for u in sp.units) if half else 0.0
    walk.add(cache)
    block = acts.block - (BF16 * sp.blocks[0].matmul if half else 0.0)  # the cache holds those
    # What a micro-batch keeps, block by block: its input (a later stage's first block reads the
    # receive buffer, kept between steps) and, without recomputation, its activations; then the
    # stage's tail: the head's and the logits (the schedule computes the loss apart from the
    # module, so the logits stay with their micro-batch), or the output sent on.
    kept = [
        (0.0 if i == 0 and not first else acts.stream) + (0.0 if recompute else block)
        for i in range(len(sp.blocks))
    ]
    head = acts.head - (BF16 * sp.head.matmul if half else 0.0)
    logits = acts.logits - (FP32 * cfg.vocab * layout.micro_batch * cfg.seq_len if half else 0.0)
    tail = head + logits if last else acts.stream
    # The schedule's loop holds the latest forward's output until the next forward replaces it,
    # even once that micro-batch's backward is done: the last stage's logits outlive it so.
    n = layout.n_micro
    walked = n if every_micro_batch else min(n, min(n, layout.pp - stage) + 3)
    rest = (n - walked) * (sum(kept) + tail) if layout.schedule == "gpipe" else 0.0
    forwards = backwards = 0
    dangling = 0.0
    for action in schedule_order(walked, layout.pp, stage, layout.schedule):
        if action == "B" and backwards == 0:
            walk.add(rest)  # GPipe: the micro-batches not walked are all in flight too
        if action == "F":
            for key, unit in ((-1, sp.root), *enumerate(sp.blocks)):
                params.gather(key, unit)
            walk.add(sum(kept) + tail)
            if last:
                walk.spike(acts.logits - logits, logits=acts.logits + acts.log_probs)
            params.end_forward()
            walk.add(-dangling)
            forwards, dangling = forwards + 1, 0.0
            continue
        if last:
            walk.spike(2 * acts.log_probs, logits=3 * acts.log_probs)
        held = logits if last and backwards == forwards - 1 else 0.0
        dangling = held
        walk.add(acts.stream - tail + held)  # the gradient flowing down the residual stream
        # The weights' bf16 copies were made by the step's first forward, so autograd, which
        # runs the newest work first, turns their gradients back to fp32 only at the end of a
        # later micro-batch's backward: until then each weight's bf16 gradient is held.
        late = half and backwards > 0
        pending = BF16 * sp.head.matmul if late else 0.0
        walk.add(pending)
        params.grads(-1, sp.head, first=backwards == 0)
        for i in reversed(range(len(sp.blocks))):
            if recompute:
                walk.add(block)
            walk.spike(acts.mlp + acts.proj_grad)
            walk.add(-kept[i] - (block if recompute else 0.0))
            if late:
                walk.add(BF16 * sp.blocks[i].matmul)
                pending += BF16 * sp.blocks[i].matmul
            params.grads(i, sp.blocks[i], first=backwards == 0)
            params.reduce(i, sp.blocks[i], sync=False, reshard=False)
        params.grads(-1, sp.embed, first=backwards == 0)
        params.reduce(-1, sp.root, sync=False, reshard=False)
        walk.add(-acts.stream)
        if late:  # each held gradient turned back to fp32 before it is added in
            walk.spike(FP32 * max(u.widest for u in sp.units))
        walk.add(-pending)
        backwards += 1
    walk.add(-dangling - rest)
    for key, unit in ((-1, sp.root), *enumerate(sp.blocks)):
        params.reduce(key, unit, sync=True)
    params.end_backward()
    walk.add(-cache)  # autocast ends with the schedule's step
    walk.spike(FP32 * sp.optimizer_temp)
    return walk
