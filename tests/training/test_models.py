from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from contracts.model import GPTConfig
from training.models.gpt import GPT
from training.parallel.pipeline import split_stage, stage_layer_ranges

CFG = GPTConfig(n_layers=3, d_model=32, n_heads=4, vocab=40, seq_len=12)


def test_same_seed_same_weights_other_seed_differs() -> None:
    a, b, c = GPT(CFG, seed=5), GPT(CFG, seed=5), GPT(CFG, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)  # type: ignore[union-attr]


def test_forward_shapes_and_initial_loss_near_uniform() -> None:
    model = GPT(CFG, seed=0)
    idx = torch.randint(0, CFG.vocab, (3, CFG.seq_len))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, CFG.seq_len, CFG.vocab)
    assert loss is not None and abs(float(loss.detach()) - math.log(CFG.vocab)) < 0.1
    assert model(idx)[1] is None


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    model = GPT(CFG, seed=0).eval()
    idx = torch.randint(0, CFG.vocab, (1, CFG.seq_len))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % CFG.vocab
    a, b = model(idx)[0], model(changed)[0]
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_heads_must_divide_width() -> None:
    with pytest.raises(ValidationError, match="divisible by n_heads"):
        GPTConfig(n_layers=1, d_model=30, n_heads=4, vocab=8, seq_len=4)


@pytest.mark.parametrize(("n", "pp", "sizes"), [(4, 2, [2, 2]), (5, 2, [3, 2]), (3, 3, [1, 1, 1])])
def test_stage_layer_ranges_cover_all_layers(n: int, pp: int, sizes: list[int]) -> None:
    ranges = stage_layer_ranges(n, pp)
    assert [len(r) for r in ranges] == sizes
    assert [i for r in ranges for i in r] == list(range(n))


def test_stages_partition_parameters_and_compose_to_the_full_model() -> None:
    full = GPT(CFG, seed=1)
    stages = [split_stage(GPT(CFG, seed=1), s, 3) for s in range(3)]
    names = [n for st in stages for n, _ in st.named_parameters()]
    assert names == [n for n, _ in full.named_parameters()]  # same names, same order, no overlap
    idx = torch.randint(0, CFG.vocab, (2, CFG.seq_len))
    h = idx
    for st in stages:
        h = st(h)
    assert torch.allclose(h, full(idx)[0], atol=1e-5)
