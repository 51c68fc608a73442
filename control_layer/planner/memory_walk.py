"""One training step's memory, walked moment by moment as the worker runs it.

Counts what a step holds beyond what stays between steps: the batch, FSDP's gathered parameters
and flat buffers, the gradients as they appear, a pipeline's micro-batches in flight and what its
schedule holds on to, and, op by op, what each micro-batch's forward and backward make and free
(``memory_ops``); then the optimizer's largest temporaries. docs/cost-model.md ("Memory") derives
each term; the figures were checked against torch's MemTracker on the worker's code
(benchmarks/memory_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.model import GPTConfig
from control_layer.planner.memory_ops import (
    Grads,
    Shapes,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
    shapes,
)
from control_layer.planner.memory_params import BF16, FP32, TOKEN_ID, Layout, StageParams, Unit


@dataclass
class Walk:
    """The bytes a step holds beyond what stays between steps, followed moment by moment, and of
    them the loss's (its logits, log-probabilities and their gradients)."""

    now: float = 0.0
    peak: float = 0.0
    loss: float = 0.0
    logits_at_peak: float = 0.0

    def add(self, nbytes: float, loss: float = 0.0) -> None:
        self.now += nbytes
        self.loss += loss
        if self.now > self.peak:
            self.peak, self.logits_at_peak = self.now, self.loss

    def spike(self, nbytes: float) -> None:
        """Held for a moment on top of what is held now."""
        if self.now + nbytes > self.peak:
            self.peak, self.logits_at_peak = self.now + nbytes, self.loss


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
        """Gradients of ``part`` (of unit ``key``) have appeared (the walk counted them as its
        backward made them): under FSDP the first pass's are the unit's whole gradients, which
        later passes add into."""
        if self.layout.fsdp and first:
            self.whole_grads[key] = self.whole_grads.get(key, 0.0) + FP32 * part.local

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
    forward (under autocast, which keeps the bf16 copies it makes to the forward's end) then
    backward, the gradients reduced on the last; then the optimizer.

    The micro-batches between the second and the last repeat the second exactly, so only the
    first, the second and the last are walked (``every_micro_batch`` walks them all)."""
    walk = Walk()
    sh = shapes(cfg, layout)
    params = _Params(walk, layout)
    walk.add(2 * TOKEN_ID * layout.micro_batch * cfg.seq_len * layout.n_micro)  # inputs, targets
    root, blocks = sp.root, sp.blocks
    recompute = layout.activation_checkpointing
    n = layout.n_micro
    for micro in range(n) if every_micro_batch else sorted({0, min(1, n - 1), n - 1}):
        first = micro == 0
        params.gather(-1, root)
        embed_forward(walk, sh)
        casts = 0.0
        for i, block in enumerate(blocks):
            params.gather(i, block)
            casts += block_forward(walk, sh, recompute, fresh_casts=True)
            if layout.reshard_after_forward:
                params.free(i, block)
        head_forward(walk, sh, fresh_casts=True, keep_logits=False)
        params.end_forward()
        walk.add(-casts)  # autocast's copies go with its forward
        if layout.reshard_after_forward:
            # ZeRO-3 frees the root's parameters with the forward (which takes in the loss) and
            # gathers them again as backward starts, prefetching the last block's.
            params.free(-1, root)
            params.gather(-1, root, forward=False)
            params.prefetch(len(blocks) - 1, blocks[-1])
        _local_backward(walk, sh, params, sp, layout, first, sync=micro == n - 1)
    walk.spike(FP32 * sp.optimizer_temp)
    return walk


def _local_backward(
    walk: Walk, sh: Shapes, params: _Params, sp: StageParams, layout: Layout, first: bool, sync: bool
) -> None:
    """One micro-batch's backward outside a pipeline, FSDP's units gathered, prefetched and
    reduced as it goes."""
    grads = Grads(walk, sh.half, "keep" if first else "add")
    head_backward(walk, sh, grads, fresh_casts=True)
    params.grads(-1, sp.head, first)
    blocks = sp.blocks
    for i in reversed(range(len(blocks))):
        params.gather(i, blocks[i], forward=False)
        if i > 0 and layout.reshard_after_forward:
            params.prefetch(i - 1, blocks[i - 1])
        recompute = layout.activation_checkpointing
        block_backward(walk, sh, grads, recompute=recompute, fresh_casts=True, own_out=True, own_in=True)
        params.grads(i, blocks[i], first)
        params.reduce(i, blocks[i], sync)
    embed_backward(walk, sh, grads)
    params.grads(-1, sp.embed, first)
    params.reduce(-1, sp.root, sync)
    params.end_backward()


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


@dataclass
class _Stage:
    """A pipeline stage's parts of a walk: which modules it has and what its schedule holds."""

    sh: Shapes
    sp: StageParams
    layout: Layout
    first: bool
    last: bool
    dangling: float = 0.0  # the latest forward's output, once its backward is done
    sent: float = 0.0  # an input gradient the schedule still holds after sending it

    @property
    def output(self) -> float:
        """What a micro-batch's forward hands on: the logits (last stage) or the stream."""
        return self.sh.logits if self.last else self.sh.stream

    def forward(self, walk: Walk) -> None:
        recompute = self.layout.activation_checkpointing
        if self.first:
            embed_forward(walk, self.sh)
        for _ in self.sp.blocks:
            block_forward(walk, self.sh, recompute, fresh_casts=False)
        if self.last:
            head_forward(walk, self.sh, fresh_casts=False, keep_logits=True)

    def backward(self, walk: Walk, params: _Params, grads: Grads, first_pass: bool) -> None:
        sh, blocks = self.sh, self.sp.blocks
        recompute = self.layout.activation_checkpointing
        if self.last:
            head_backward(walk, sh, grads, fresh_casts=False)
            params.grads(-1, self.sp.head, first_pass)
        for i in reversed(range(len(blocks))):
            own_out, own_in = self.last or i < len(blocks) - 1, self.first or i > 0
            block_backward(
                walk, sh, grads, recompute=recompute, fresh_casts=False, own_out=own_out, own_in=own_in
            )
            params.grads(i, blocks[i], first_pass)
            params.reduce(i, blocks[i], sync=False, reshard=False)
        if self.first:
            embed_backward(walk, sh, grads)
            params.grads(-1, self.sp.embed, first_pass)
        params.reduce(-1, self.sp.root, sync=False, reshard=False)
        grads.finish()


def pipeline_step(
    cfg: GPTConfig, layout: Layout, sp: StageParams, stage: int, every_micro_batch: bool = False
) -> Walk:
    """One step of a pipeline stage, its schedule's forwards and backwards in order, all under
    one autocast (so the bf16 copies of the stage's weights live the whole step), FSDP's
    gradients kept whole and reduced once after the last backward; then the optimizer.

    What the schedule holds (``torch.distributed.pipelining``): each micro-batch's output until
    its backward ends, and the latest forward's output until the next forward replaces it; a
    later stage's input gradient, once sent, until 1F1B's next backward has ended (GPipe: until
    its next backward starts); the last of these until the step ends.

    A long schedule repeats itself: 1F1B's steady state after three rounds, GPipe's backwards
    after the third (its forwards only add up, so the others' activations are added at once).
    So at most the pipeline's fill and three more micro-batches are walked
    (``every_micro_batch`` walks them all)."""
    walk = Walk()
    st = _Stage(shapes(cfg, layout), sp, layout, first=stage == 0, last=stage == layout.pp - 1)
    params = _Params(walk, layout)
    walk.add(2 * TOKEN_ID * layout.micro_batch * cfg.seq_len * layout.n_micro)  # inputs, targets
    cache = BF16 * sum(u.matmul + u.bias for u in sp.units) if st.sh.half else 0.0
    walk.add(cache)
    n = layout.n_micro
    walked = n if every_micro_batch else min(n, min(n, layout.pp - stage) + 3)
    rest = 0.0
    if layout.schedule == "gpipe":  # the micro-batches not walked are all in flight too
        scratch = Walk()
        st.forward(scratch)
        rest = (n - walked) * scratch.now
    forwards = backwards = 0
    for action in schedule_order(walked, layout.pp, stage, layout.schedule):
        if action == "F":
            for key, unit in ((-1, sp.root), *enumerate(sp.blocks)):
                params.gather(key, unit)
            st.forward(walk)
            params.end_forward()
            walk.add(-st.dangling)
            forwards, st.dangling = forwards + 1, 0.0
            continue
        if backwards == 0:
            walk.add(rest)
        _pipeline_backward(walk, st, params, backwards, latest=backwards == forwards - 1)
        backwards += 1
    for key, unit in ((-1, sp.root), *enumerate(sp.blocks)):
        params.reduce(key, unit, sync=True)
    params.end_backward()
    walk.add(-st.dangling - st.sent - rest)  # what the schedule held, with its step
    walk.add(-cache)  # autocast ends with the schedule's step
    walk.spike(FP32 * sp.optimizer_temp)
    return walk


def _pipeline_backward(walk: Walk, st: _Stage, params: _Params, backwards: int, latest: bool) -> None:
    """One micro-batch's backward in a pipeline, and what the schedule then lets go of or keeps."""
    gpipe = st.layout.schedule == "gpipe"
    if gpipe:
        walk.add(-st.sent)  # the last input gradient sent, let go as the next backward starts
        st.sent = 0.0
    first_pass = backwards == 0
    mode = "keep" if first_pass else ("late" if st.sh.half else "add")
    st.backward(walk, params, Grads(walk, st.sh.half, mode), first_pass)
    # Its output is let go with the backward, unless it is the latest forward's; a later stage's
    # input gradient is sent and held (1F1B: the one before it let go now).
    if latest:
        st.dangling = st.output
    else:
        walk.add(-st.output)
    if not st.first:
        if not gpipe:
            walk.add(-st.sent)
        st.sent = st.sh.stream
