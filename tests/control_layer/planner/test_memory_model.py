"""The memory rule, checked against hand arithmetic and its own bookkeeping (MemTracker's checks
of it are in tests/benchmarks/test_memtrack.py and benchmarks/memory_fit.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from contracts.job_spec import JobSpec
from contracts.model import GPTConfig, gpt_param_count
from control_layer.planner import cost_model as cm
from control_layer.planner.memory_model import Layout, device_memory, stage_memory
from control_layer.planner.memory_ops import (
    Grads,
    block_backward,
    block_forward,
    head_backward,
    head_forward,
    shapes,
)
from control_layer.planner.memory_params import stage_params
from control_layer.planner.memory_walk import Walk, local_step, pipeline_step, schedule_order
from control_layer.planner.problem import INFEASIBLE, fewest_replicas

CFG = GPTConfig(n_layers=4, d_model=64, n_heads=4, vocab=256, seq_len=32)


def _block(d: int, tp: int) -> int:
    """One block's parameters on a tp rank, by hand: q, k, v and fc split by columns (with their
    biases), the two output projections by rows (their biases whole), the norms whole."""
    return (3 * d * d + 4 * d * d + 4 * d * d + d * d) // tp + (3 * d + 4 * d) // tp + (d + d) + 4 * d


def test_tensor_parallelism_splits_only_the_blocks_linear_layers() -> None:
    d, v, s = CFG.d_model, CFG.vocab, CFG.seq_len
    for tp in (1, 2, 4):
        sp = stage_params(CFG, tp, 1, 1, 0)
        assert [u.local for u in sp.blocks] == [_block(d, tp)] * 4
        assert sp.embed.local == v * d + s * d  # whole on every tp rank
        assert sp.head.local == 2 * d + v * d
    assert sum(u.local for u in stage_params(CFG, 1, 1, 1, 0).units) == gpt_param_count(CFG)


def test_fsdp_pads_each_tensor_to_equal_chunks() -> None:
    cfg = GPTConfig(n_layers=1, d_model=12, n_heads=3, vocab=10, seq_len=5)
    sp = stage_params(cfg, 1, 1, 4, 0)
    # tok_emb 10 x 12 -> 3 rows a rank; pos_emb 5 x 12 -> 2 rows; norm 12 -> 3; lm_head 10 x 12 -> 3.
    assert sp.root.shard == 3 * 12 + 2 * 12 + 2 * 3 + 3 * 12
    memory = stage_memory(cfg, Layout(zero=1, shard_group=4), 0)
    assert memory.weights == memory.grads == 4 * sum(u.shard for u in sp.units)
    assert memory.optimizer == 2 * memory.weights + 4 * sum(u.tensors for u in sp.units)


def test_ddp_keeps_a_bucket_copy_of_the_gradients_and_a_pipeline_its_receive_buffers() -> None:
    alone = stage_memory(CFG, Layout(), 0)
    ddp = stage_memory(CFG, Layout(shard_group=2), 0)
    assert alone.buffers == 0 and ddp.buffers == 4 * gpt_param_count(CFG)
    tokens = 2 * CFG.seq_len
    middle = stage_memory(CFG, Layout(pp=4, n_micro=6, micro_batch=2), 1)
    assert middle.buffers == 2 * 6 * 4 * tokens * CFG.d_model  # activations in, gradients in


def test_the_loss_backward_peak_by_hand() -> None:
    """fp32, one micro-batch, a vocabulary large enough that the loss's backward is the peak:
    everything the forward kept, plus the log-softmax gradient in and out beside its output."""
    cfg = GPTConfig(n_layers=1, d_model=16, n_heads=2, vocab=4096, seq_len=64)
    t, d, v = 64, 16, 4096
    per_block = 4 * t * d + (12 + 48) * t * d + 16 * t + 4 * t * 2  # input, activations, small
    head = 4 * t * d + 4 * t * d + 8 * t + 4 * t * v  # norm input, lm_head input, log-probs
    batch = 2 * 8 * t
    positions = 8 * t  # the position ids the embedding keeps for its backward
    memory = stage_memory(cfg, Layout(), 0)
    assert memory.activations == batch + positions + per_block + head + 2 * 4 * t * v
    assert memory.logits == 3 * 4 * t * v


def test_a_block_and_the_head_give_back_what_they_take() -> None:
    """A block's forward leaves its output, what it saved (nothing when recomputed) and the copies
    autocast holds to the forward's end; its backward, from its output's gradient, frees all it
    kept and its input and leaves its input's gradient. The head's backward leaves the gradient
    of the stream. Gradients added in place leave nothing behind."""
    for half, tp, recompute, fresh in itertools.product(
        (False, True), (1, 2, 4), (False, True), (False, True)
    ):
        sh = shapes(CFG, Layout(tp=tp, micro_batch=2, precision="bf16" if half else "fp32"))
        walk = Walk(now=sh.stream)  # the block's input
        held = block_forward(walk, sh, recompute, fresh)
        kept = 0.0 if recompute else sh.saved(fresh)
        assert walk.now == pytest.approx(sh.stream + kept + sh.stream + held)
        walk.add(-held - sh.stream)  # the copies go with the forward; the output's gradient replaces it
        walk.add(sh.stream)
        grads = Grads(walk, half, "add")
        block_backward(walk, sh, grads, recompute=recompute, fresh_casts=fresh, own_out=True, own_in=True)
        assert walk.now == pytest.approx(sh.stream)
        assert walk.peak > 2 * sh.stream + kept
        walk = Walk(now=sh.stream)
        head_forward(walk, sh, fresh, keep_logits=False)
        head_backward(walk, sh, Grads(walk, half, "add"), fresh)
        assert walk.now == pytest.approx(sh.stream) and walk.loss == pytest.approx(0.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_a_step_ends_holding_its_batch_and_gradients(schedule: str) -> None:
    """Every byte the walk takes is given back but the gradients the optimizer steps with."""
    for pp, n, zero, group, half, ac in itertools.product(
        (1, 2, 4), (1, 3, 4), (0, 1, 3), (1, 2), (False, True), (False, True)
    ):
        if n < pp:
            continue
        layout = Layout(
            pp=pp,
            zero=zero,
            shard_group=group,
            n_micro=n,
            precision="bf16" if half else "fp32",
            activation_checkpointing=ac,
            schedule=schedule,
        )
        for stage in range(pp):
            sp = stage_params(CFG, 1, pp, layout.shards, stage)
            walk = local_step(CFG, layout, sp) if pp == 1 else pipeline_step(CFG, layout, sp, stage)
            grads = 4 * sum(u.shard if layout.fsdp else u.local for u in sp.units)
            assert walk.now == pytest.approx(2 * 8 * CFG.seq_len * n + grads)


def test_walking_a_few_micro_batches_gives_the_peak_of_walking_them_all() -> None:
    for pp, n, schedule, zero in itertools.product((1, 2, 4), (5, 9, 17), ("1f1b", "gpipe"), (0, 1, 3)):
        layout = Layout(pp=pp, zero=zero, shard_group=2, n_micro=n, precision="bf16", schedule=schedule)
        for stage in range(pp):
            sp = stage_params(CFG, 1, pp, layout.shards, stage)
            if pp == 1:
                short, full = local_step(CFG, layout, sp), local_step(CFG, layout, sp, every_micro_batch=True)
            else:
                short = pipeline_step(CFG, layout, sp, stage)
                full = pipeline_step(CFG, layout, sp, stage, every_micro_batch=True)
            assert short.peak == pytest.approx(full.peak)


def test_schedules_hold_as_many_micro_batches_as_their_kind() -> None:
    assert schedule_order(4, 2, 0, "gpipe") == ["F"] * 4 + ["B"] * 4
    assert schedule_order(4, 2, 0, "1f1b") == ["F", "F", "B", "F", "B", "F", "B", "B"]
    assert schedule_order(4, 2, 1, "1f1b") == ["F", "B"] * 4


def test_the_fullest_stage_is_the_device_figure() -> None:
    layout = Layout(pp=4, n_micro=4, precision="bf16")
    stages = [stage_memory(CFG, layout, s).total for s in range(4)]
    assert device_memory(CFG, layout).total == max(stages)


def test_fewest_replicas_is_exact_per_count() -> None:
    """Against the definition: the fewest r from which every count up to the member's cap fits."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        most = int(rng.integers(1, 9))
        need = rng.uniform(1.0, 10.0, size=most)
        usable = rng.uniform(0.0, 11.0, size=5)
        cap = rng.integers(0, most + 1, size=5)
        lo = fewest_replicas(need, usable, cap)
        for u in range(5):
            top = max(1, int(cap[u]))
            ok = [r for r in range(1, top + 1) if all(need[k - 1] <= usable[u] for k in range(r, top + 1))]
            assert lo[u] == (ok[0] if ok else INFEASIBLE)


def test_memory_per_device_is_the_rule_for_the_jobs_settings() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "model": CFG.model_dump(exclude={"dropout", "mlp_ratio"}),
            "training": {
                "steps": 10,
                "global_batch_tokens": 32 * 8,
                "precision": "bf16",
                "micro_batch_size": 2,
            },
        }
    )
    got = cm.memory_per_device(spec, 2, 2, 1, 4, 2, "gpipe")
    layout = Layout(
        tp=2, pp=2, zero=1, shard_group=4, n_micro=2, micro_batch=2, precision="bf16", schedule="gpipe"
    )
    assert got == device_memory(CFG, layout)
    # Without ZeRO, two replicas or eight in a group hold the same (DDP, or FSDP replicating).
    assert cm.memory_per_device(spec, 1, 1, 0, 8, 2, "1f1b") == cm.memory_per_device(
        spec, 1, 1, 0, 2, 2, "1f1b"
    )
