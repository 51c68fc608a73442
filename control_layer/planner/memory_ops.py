"""One micro-batch through a stage's modules, tensor by tensor, as the worker's GPT runs them.

``training.models.gpt`` under the step's precision (autocast: the matmuls in bf16, LayerNorm, the
residual stream and the loss in fp32) and tensor parallelism (``contracts.model.TP_PLAN``: q, k,
v and fc split by columns, the two output projections by rows and followed by an all-reduce of
their full-width output; in backward the column-parallel layers' input gradients are all-reduced).
Each function adds to a walk what appears and takes away what is freed, in the order the ops (and
autograd, in backward) run, so the walk sees the moments inside a module that peak. The order and
sizes were read op by op off MemTracker's record of the worker's step
(``benchmarks/memory_fit.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

from contracts.model import TP_PLAN, GPTConfig, gpt_param_shapes, tp_local_shape
from control_layer.planner.memory_params import BF16, FP32, TOKEN_ID, Layout


class Moments(Protocol):
    def add(self, nbytes: float, loss: float = 0.0) -> None: ...

    def spike(self, nbytes: float) -> None: ...


@dataclass(frozen=True)
class Linear:
    """A Linear layer's parameter values on one tp rank."""

    weight: int
    bias: int


@dataclass(frozen=True, eq=False)
class Shapes:
    """Bytes of one micro-batch's tensors on one device (T = micro_batch x seq_len tokens).
    Compared by identity: ``shapes`` makes one per model and layout, and the tapes below are
    cached on it."""

    half: bool  # autocast to bf16
    tp: int
    stream: float  # fp32 T x d: the residual stream, LayerNorm outputs, their gradients
    cast: float  # the bf16 copy of a T x d fp32 tensor a matmul reads under autocast (else 0)
    part: float  # q, k, v or the attention output: T x d/tp at the matmuls' width
    hidden: float  # the MLP's hidden layer: T x r·d/tp at the matmuls' width
    full: float  # a full-width matmul output, T x d at the matmuls' width
    stat: float  # one LayerNorm statistic (mean or rstd), fp32 T
    lse: float  # attention's log-sum-exp, fp32 T x heads/tp
    logits: float  # T x V at the matmuls' width
    probs: float  # T x V fp32: the log-probabilities, their gradients
    linears: tuple[tuple[str, Linear], ...]  # a block's, by module name
    norm: int  # a LayerNorm's weight values (its bias has as many)
    lm_head: int
    tok_emb: int
    pos_emb: int
    positions: float  # the position ids the first stage keeps for its embedding's backward
    pos_sum: float  # the position embedding's gradient summed over the batch, fp32 s x d

    def linear(self, name: str) -> Linear:
        return next(lin for key, lin in self.linears if key == name)

    @property
    def cast_weights(self) -> float:
        """A block's weights' bf16 copies (0 in fp32)."""
        return BF16 * sum(lin.weight for _, lin in self.linears) if self.half else 0.0

    @property
    def cast_biases(self) -> float:
        return BF16 * sum(lin.bias for _, lin in self.linears) if self.half else 0.0

    def saved(self, fresh_casts: bool) -> float:
        """What a block's forward keeps for backward beyond its input: both LayerNorms'
        statistics; q, k, v, the attention output and its log-sum-exp; the residual after
        attention; the MLP's hidden layer before and after GELU; the LayerNorm outputs the matmuls
        read (fp32: one each, q, k and v share theirs) or under autocast their bf16 copies (one per
        matmul: q, k, v, fc), and the weights' bf16 copies where autocast makes them now."""
        reads = 4 * self.cast if self.half else 2 * self.stream
        casts = self.cast_weights if fresh_casts else 0.0
        return 4 * self.stat + 4 * self.part + self.lse + self.stream + reads + 2 * self.hidden + casts


def shapes(cfg: GPTConfig, layout: Layout) -> Shapes:
    return _shapes(cfg, layout.tp, layout.micro_batch, layout.precision == "bf16")


@functools.lru_cache(maxsize=1024)
def _shapes(cfg: GPTConfig, t: int, micro_batch: int, half: bool) -> Shapes:
    d, v, s = cfg.d_model, cfg.vocab, cfg.seq_len
    tokens = micro_batch * s
    width = BF16 if half else FP32
    one_block = gpt_param_shapes(cfg.model_copy(update={"n_layers": 1}))  # every block is alike
    local = {name: math.prod(tp_local_shape(name, shape, t)) for name, shape in one_block.items()}
    linears = tuple(
        (name, Linear(local[f"layers.0.{name}.weight"], local[f"layers.0.{name}.bias"])) for name in TP_PLAN
    )
    return Shapes(
        half=half,
        tp=t,
        stream=FP32 * tokens * d,
        cast=BF16 * tokens * d if half else 0.0,
        part=width * tokens * d / t,
        hidden=width * tokens * cfg.mlp_ratio * d / t,
        full=width * tokens * d,
        stat=FP32 * tokens,
        lse=FP32 * tokens * cfg.n_heads / t,
        logits=width * tokens * v,
        probs=FP32 * tokens * v,
        linears=linears,
        norm=d,
        lm_head=local["lm_head.weight"],
        tok_emb=local["tok_emb.weight"],
        pos_emb=local["pos_emb.weight"],
        positions=TOKEN_ID * s,
        pos_sum=FP32 * s * d,
    )


class Grads:
    """A micro-batch's parameter gradients as its backward makes them.

    ``keep``: the pass that finds no ``.grad`` (the step's first) keeps each fp32 gradient as it.
    ``add``: a later pass adds each into ``.grad`` in place as it appears. ``late``: a pipeline's
    later micro-batches under one autocast for the step: the bf16 copies of the weights were
    made by the step's first forward, so autograd, which runs the newest work first, turns their
    gradients back to fp32 only at the end of the pass; until then each bf16 gradient is held.
    Under autocast a matmul's weight gradient is made in bf16 and turned into fp32 by its cast's
    backward; LayerNorm and embedding gradients are fp32 already."""

    def __init__(self, walk: Moments, half: bool, mode: str) -> None:
        self.walk, self.half, self.mode = walk, half, mode
        self.pending: list[int] = []  # held bf16 gradients' values, in the order autograd made them

    def new(self, lin: Linear) -> None:
        """A matmul's weight and bias gradients, at the matmul's width."""
        self.walk.add((BF16 if self.half else FP32) * (lin.weight + lin.bias))

    def settle(self, lin: Linear) -> None:
        """The matmul's gradients into ``.grad``: cast back to fp32 (under autocast), then kept or
        added in place (or held in bf16 to the pass's end)."""
        if self.half and self.mode == "late":
            self.pending += [lin.weight, lin.bias]
            return
        for values in (lin.weight, lin.bias):
            if self.half:  # the fp32 copy made before the bf16 one is freed
                self.walk.add(FP32 * values)
                self.walk.add(-BF16 * values)
            if self.mode != "keep":
                self.walk.add(-FP32 * values)

    def plain(self, values: int) -> None:
        """An fp32 parameter's gradient (LayerNorm, embeddings)."""
        self.walk.add(FP32 * values)
        if self.mode != "keep":
            self.walk.add(-FP32 * values)

    def finish(self) -> None:
        """The held bf16 gradients turned back to fp32 one at a time and added in, the newest
        cast's first: in the order backward made them (a weight's before its bias's)."""
        if self.pending:
            _finish_tape(tuple(self.pending)).play(self.walk)
        self.pending = []


def embed_forward(walk: Moments, sh: Shapes) -> None:
    """Token and position lookups, summed into the stream; the position ids stay for backward."""
    walk.add(sh.positions + sh.stream + sh.pos_sum)
    walk.add(sh.stream)
    walk.add(-sh.stream - sh.pos_sum)


def embed_backward(walk: Moments, sh: Shapes, grads: Grads) -> None:
    """From the stream's gradient: the position gradient summed over the batch, then each table's."""
    walk.add(sh.pos_sum)
    grads.plain(sh.pos_emb)
    walk.add(-sh.pos_sum - sh.positions)
    grads.plain(sh.tok_emb)
    walk.add(-sh.stream)


def _matmul_in(walk: Moments, sh: Shapes, lin: Linear, reads: float, fresh_casts: bool) -> float:
    """What a matmul reads under autocast: its weight's and bias's bf16 copies where autocast makes
    them now, and the copy of its fp32 input (``reads``). Returns the copies autocast holds to the
    forward's end (the bias's: a matmul keeps only its weight's)."""
    cast = BF16 * (lin.weight + lin.bias) if sh.half and fresh_casts else 0.0
    walk.add(cast + reads)
    return BF16 * lin.bias if cast else 0.0


def _block_forward(walk: Moments, sh: Shapes, recompute: bool, fresh_casts: bool) -> float:
    """A block's forward on its input (held by the caller): leaves what it keeps for backward
    (nothing under recomputation, where each tensor goes once the module that made it is done
    with it) and its output. Returns the bf16 copies autocast keeps to the forward's end beyond
    those saved (all a recomputed block's: checkpoint saves none)."""
    s, c, tp = sh.stream, sh.cast, sh.tp > 1

    def drop(nbytes: float) -> None:
        if recompute:
            walk.add(-nbytes)

    held = 0.0
    walk.add(s + 2 * sh.stat)  # ln1: output and statistics
    drop(2 * sh.stat)
    for name in ("attn.q", "attn.k", "attn.v"):
        held += _matmul_in(walk, sh, sh.linear(name), c, fresh_casts)
        walk.add(sh.part)
        drop(c)
    walk.add(sh.part + sh.lse)  # attention
    drop(sh.lse)
    held += _matmul_in(walk, sh, sh.linear("attn.proj"), 0.0, fresh_casts)
    _row_parallel_out(walk, sh, tp)
    drop(4 * sh.part)  # q, k, v and the attention output
    walk.add(-s if sh.half or recompute else 0.0)  # ln1's output (fp32 q, k and v keep it)
    walk.add(s)  # the residual after attention
    walk.add(-sh.full)
    walk.add(s + 2 * sh.stat)  # ln2
    drop(2 * sh.stat)
    held += _matmul_in(walk, sh, sh.linear("mlp.fc"), c, fresh_casts)
    walk.add(sh.hidden)
    drop(c)
    walk.add(sh.hidden)  # GELU
    drop(sh.hidden)
    held += _matmul_in(walk, sh, sh.linear("mlp.proj"), 0.0, fresh_casts)
    _row_parallel_out(walk, sh, tp)
    drop(sh.hidden)
    walk.add(-s if sh.half or recompute else 0.0)  # ln2's output
    walk.add(s)  # the block's output
    walk.add(-sh.full)
    drop(s)  # the residual after attention
    if recompute:
        held += sh.cast_weights if fresh_casts else 0.0
    return held


def _row_parallel_out(walk: Moments, sh: Shapes, tp: bool) -> None:
    """A row-parallel projection's full-width output, all-reduced into a new tensor under TP."""
    walk.add(sh.full)
    if tp:
        walk.spike(sh.full)


def _recompute(walk: Moments, sh: Shapes, fresh_casts: bool) -> None:
    """Checkpoint's recomputation at the start of a block's backward: the forward again, keeping
    what backward needs, and stopped once it has it (before the MLP's output projection). At the
    stop the MLP still holds its fp32 input (autocast reads a bf16 copy of it), and a fresh
    autocast has made the biases' copies, freed with it."""
    walk.add(sh.saved(fresh_casts))
    walk.spike((sh.stream if sh.half else 0.0) + (sh.cast_biases if fresh_casts else 0.0))


def _column_backward(
    walk: Moments, sh: Shapes, grads: Grads, lin: Linear, freed: float, fresh_casts: bool
) -> None:
    """A column-parallel matmul's backward: its full-width input gradient and weight gradient;
    its output's gradient, its saved input and weight copy freed; under autocast the input
    gradient back to fp32; under TP the input gradient all-reduced into a new tensor."""
    walk.add(sh.full)
    grads.new(lin)
    walk.add(-freed - (BF16 * lin.weight if sh.half and fresh_casts else 0.0))
    if sh.half:
        walk.add(sh.stream)
        walk.add(-sh.full)
    grads.settle(lin)
    if sh.tp > 1:
        walk.spike(sh.stream)


def _mlp_backward(walk: Moments, sh: Shapes, grads: Grads, fresh_casts: bool) -> None:
    proj, fc = sh.linear("mlp.proj"), sh.linear("mlp.fc")
    walk.add(sh.hidden)
    grads.new(proj)
    # The output gradient's bf16 copy, GELU's output and the weight's copy freed.
    walk.add(-sh.cast - sh.hidden - (BF16 * proj.weight if sh.half and fresh_casts else 0.0))
    grads.settle(proj)
    walk.add(sh.hidden)  # GELU's backward
    walk.add(-2 * sh.hidden)
    _column_backward(walk, sh, grads, fc, sh.hidden + (sh.cast if sh.half else sh.stream), fresh_casts)


def _attention_backward(walk: Moments, sh: Shapes, grads: Grads, fresh_casts: bool) -> None:
    proj = sh.linear("attn.proj")
    walk.add(sh.cast + sh.part)  # the residual gradient's bf16 copy; the attention output's gradient
    grads.new(proj)
    walk.add(-sh.cast - (BF16 * proj.weight if sh.half and fresh_casts else 0.0))
    grads.settle(proj)
    walk.add(3 * sh.part)  # q, k and v's gradients
    walk.add(-2 * sh.part - 3 * sh.part - sh.lse)  # the output's gradient, the saved q, k, v, output
    for i, name in enumerate(("attn.v", "attn.k", "attn.q")):
        # Each frees its gradient and its input's bf16 copy; in fp32 q, k and v share their input.
        reads = sh.cast if sh.half else (sh.stream if i == 2 else 0.0)
        _column_backward(walk, sh, grads, sh.linear(name), sh.part + reads, fresh_casts)
        if i:  # two input gradients summed into one
            walk.add(sh.stream)
            walk.add(-2 * sh.stream)


def _block_backward(
    walk: Moments,
    sh: Shapes,
    grads: Grads,
    *,
    recompute: bool,
    fresh_casts: bool,
    own_out: bool,
    own_in: bool,
) -> None:
    """A block's backward from its output's gradient (a tensor of this pass where ``own_out``, else
    the pipeline's receive buffer): frees what the block kept and its input (``own_in``: else the
    receive buffer) and leaves its input's gradient."""
    s = sh.stream
    walk.add(sh.cast)  # the output gradient's bf16 copy for the MLP's branch
    if recompute:
        _recompute(walk, sh, fresh_casts)
    _mlp_backward(walk, sh, grads, fresh_casts)
    walk.add(s)  # ln2's input gradient
    grads.plain(2 * sh.norm)
    walk.add(-2 * s - 2 * sh.stat)  # the gradient it read, its saved input and statistics
    walk.add(s - (s if own_out else 0.0) - s)  # the residual's gradient
    _attention_backward(walk, sh, grads, fresh_casts)
    walk.add(s)  # ln1's input gradient
    grads.plain(2 * sh.norm)
    walk.add(-s - (s if own_in else 0.0) - 2 * sh.stat)
    walk.add(s - 2 * s)  # the input's gradient, the residual's and ln1's freed


@dataclass
class _Tape:
    """A sequence of moments reduced to what a walk needs of it: the highest point above where it
    starts and where it ends (every block of a stage runs the same sequence)."""

    now: float = 0.0
    top: float = 0.0

    def add(self, nbytes: float, loss: float = 0.0) -> None:
        self.now += nbytes
        self.top = max(self.top, self.now)

    def spike(self, nbytes: float) -> None:
        self.top = max(self.top, self.now + nbytes)

    def play(self, walk: Moments) -> None:
        walk.spike(self.top)
        walk.add(self.now)


@functools.lru_cache(maxsize=1024)
def _finish_tape(pending: tuple[int, ...]) -> _Tape:
    tape = _Tape()
    for values in pending:
        tape.spike(FP32 * values)
        tape.add(-BF16 * values)
    return tape


@functools.lru_cache(maxsize=4096)
def _forward_tape(sh: Shapes, recompute: bool, fresh_casts: bool) -> tuple[_Tape, float]:
    tape = _Tape()
    return tape, _block_forward(tape, sh, recompute, fresh_casts)


def block_forward(walk: Moments, sh: Shapes, recompute: bool, fresh_casts: bool) -> float:
    """``_block_forward`` on ``walk``."""
    tape, held = _forward_tape(sh, recompute, fresh_casts)
    tape.play(walk)
    return held


@functools.lru_cache(maxsize=4096)
def _backward_tape(
    sh: Shapes, mode: str, recompute: bool, fresh_casts: bool, own_out: bool, own_in: bool
) -> tuple[_Tape, tuple[int, ...]]:
    tape = _Tape()
    grads = Grads(tape, sh.half, mode)
    _block_backward(
        tape, sh, grads, recompute=recompute, fresh_casts=fresh_casts, own_out=own_out, own_in=own_in
    )
    return tape, tuple(grads.pending)


def block_backward(
    walk: Moments,
    sh: Shapes,
    grads: Grads,
    *,
    recompute: bool,
    fresh_casts: bool,
    own_out: bool,
    own_in: bool,
) -> None:
    """``_block_backward`` on ``walk``, its held gradients left with ``grads``."""
    tape, pending = _backward_tape(sh, grads.mode, recompute, fresh_casts, own_out, own_in)
    tape.play(walk)
    grads.pending += pending


def head_forward(walk: Moments, sh: Shapes, fresh_casts: bool, keep_logits: bool) -> None:
    """The final LayerNorm, the lm_head and the loss on the last block's output (held by the
    caller). The loss takes an fp32 copy of the logits under autocast and keeps its log-softmax
    output. A pipeline's last stage keeps the logits (its output); otherwise they go with the
    loss's forward."""
    walk.add(2 * sh.stat + sh.stream)
    if sh.half:
        walk.add(BF16 * sh.lm_head if fresh_casts else 0.0)
        walk.add(sh.cast)
    walk.add(sh.logits, loss=sh.logits)
    if sh.half:
        walk.add(-sh.stream)  # the matmul keeps the bf16 copy of its input
        walk.add(sh.probs, loss=sh.probs)
    walk.add(sh.probs, loss=sh.probs)
    if sh.half:
        walk.add(-sh.probs, loss=-sh.probs)
    if not keep_logits:
        walk.add(-sh.logits, loss=-sh.logits)


def head_backward(walk: Moments, sh: Shapes, grads: Grads, fresh_casts: bool) -> None:
    """The loss's and the head's backward: leaves the last block's output gradient."""
    # The gradient into and out of log-softmax beside its output; then the first and the output
    # freed, the logits' fp32 gradient left (turned back to bf16 under autocast).
    walk.add(2 * sh.probs, loss=2 * sh.probs)
    walk.add(-2 * sh.probs, loss=-2 * sh.probs)
    d_logits = sh.probs
    if sh.half:
        walk.add(sh.logits, loss=sh.logits)
        walk.add(-sh.probs, loss=-sh.probs)
        d_logits = sh.logits
    lm_head = Linear(sh.lm_head, 0)
    grads.new(lm_head)
    walk.add(sh.full)  # the norm output's gradient
    read = sh.cast if sh.half else sh.stream
    walk.add(-read - (BF16 * sh.lm_head if sh.half and fresh_casts else 0.0))
    walk.add(-d_logits, loss=-d_logits)
    if sh.half:
        walk.add(sh.stream)
        walk.add(-sh.full)
    grads.settle(lm_head)
    walk.add(sh.stream)  # the norm's input gradient
    grads.plain(2 * sh.norm)
    walk.add(-2 * sh.stream - 2 * sh.stat)  # the gradient it read, its saved input and statistics
