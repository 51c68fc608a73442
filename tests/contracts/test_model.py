"""The planner's parameter count is the worker's: checked against modules actually built."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.job_spec import ModelSpec
from contracts.model import gpt_block_param_count, gpt_param_count, model_config
from training.models.gpt import GPT


@st.composite
def model_specs(draw: st.DrawFn) -> ModelSpec:
    heads = draw(st.integers(1, 4))
    return ModelSpec(
        n_layers=draw(st.integers(1, 3)),
        d_model=heads * draw(st.integers(1, 12)),
        n_heads=heads,
        vocab=draw(st.integers(2, 300)),
        seq_len=draw(st.integers(1, 64)),
    )


@settings(max_examples=40, deadline=None)
@given(model_specs())
def test_spec_counts_the_parameters_of_the_built_model(spec: ModelSpec) -> None:
    model = GPT(model_config(spec))
    assert spec.n_params == gpt_param_count(model_config(spec)) == sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.layers["0"].parameters())
    assert gpt_block_param_count(model_config(spec)) == block


def test_gpt2_small_shape_has_an_untied_head() -> None:
    # 124M with a tied head; the worker's separate lm_head adds vocab x d_model.
    spec = ModelSpec(n_layers=12, d_model=768, n_heads=12, vocab=50304, seq_len=1024)
    assert spec.n_params == 163_109_376
