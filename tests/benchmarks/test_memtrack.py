"""The planner's memory rule against torch's MemTracker on the worker's own build and step
(``benchmarks/_memtrack.py``), for layouts that exercise its parts: gradient accumulation under
autocast, FSDP with tensor parallelism, FSDP's no-sync passes, recomputation, a pipeline's last
and middle stages under either schedule. ``benchmarks/memory_fit.py`` runs the same comparison
over hundreds of drawn options."""

from __future__ import annotations

import pytest

from benchmarks._memtrack import Layout, measure
from contracts.model import GPTConfig
from control_layer.planner import memory_model

CFG = GPTConfig(n_layers=2, d_model=64, n_heads=4, vocab=512, seq_len=32)

LAYOUTS = {
    "bf16, 2 micro-batches": Layout(CFG, micro_batch=2, microbatches=2, precision="bf16"),
    "tp 2, ZeRO-1 over 2": Layout(CFG, tp=2, zero=1, dp_local=2, micro_batch=2, precision="bf16"),
    "pp 2 last stage, recomputed": Layout(
        CFG, pp=2, microbatches=4, activation_checkpointing=True, precision="bf16", stage=1
    ),
    # Small enough that a block's gradients weigh as much as its activations.
    "tp 2, ZeRO-3, 4 micro-batches, fp32": Layout(
        GPTConfig(n_layers=1, d_model=64, n_heads=4, vocab=128, seq_len=8), tp=2, zero=3, microbatches=4
    ),
    "tp 4, recomputed, ZeRO-3": Layout(
        CFG, tp=4, zero=3, dp_local=2, microbatches=2, activation_checkpointing=True
    ),
    "pp 4 middle stage, 1F1B, tp 2, recomputed": Layout(
        GPTConfig(n_layers=4, d_model=64, n_heads=4, vocab=512, seq_len=32),
        tp=2,
        pp=4,
        microbatches=4,
        activation_checkpointing=True,
        precision="bf16",
        stage=1,
    ),
    "pp 2 later stage, GPipe, fp32": Layout(CFG, pp=2, microbatches=4, pp_schedule="gpipe", stage=1),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_planned_memory_is_what_memtracker_measures(name: str) -> None:
    h = LAYOUTS[name]
    got = measure(h)
    layout = memory_model.Layout(
        tp=h.tp,
        pp=h.pp,
        zero=h.zero,
        shard_group=h.dp_local,
        n_micro=h.microbatches,
        micro_batch=h.micro_batch,
        precision=h.precision,
        activation_checkpointing=h.activation_checkpointing,
        schedule=h.pp_schedule,
    )
    planned = memory_model.stage_memory(h.model, layout, h.stage)
    for term in ("weights", "grads", "optimizer", "buffers"):
        assert getattr(planned, term) == pytest.approx(getattr(got, term), rel=0.005), term
    assert planned.activations == pytest.approx(got.activations, rel=0.02)
    assert planned.total >= 0.99 * got.peak


def test_fake_tensors_measure_what_real_ones_hold() -> None:
    """Tensor parallelism with gradient accumulation: DTensor's shape inference must not count
    (it runs on fake tensors of the whole shape), so fake and real tensors measure alike."""
    h = Layout(GPTConfig(n_layers=2, d_model=64, n_heads=4, vocab=128, seq_len=16), tp=4, microbatches=4)
    fake, real = measure(h), measure(h, real=True)
    for term in ("weights", "optimizer", "buffers", "grads", "peak"):
        assert getattr(fake, term) == pytest.approx(getattr(real, term), abs=64), term  # a few scalars
