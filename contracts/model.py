"""The model the worker builds, described without torch: its config, and its exact size.

``model_config`` is the one way from a job's ``ModelSpec`` to the worker's ``GPTConfig``, and
``gpt_param_count`` counts the parameters of the module ``training.models.gpt.GPT`` builds from
it (separate ``lm_head``, no tying), so the planner prices exactly the model that trains.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from contracts.job_spec import ModelSpec


class GPTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    vocab: int = Field(gt=1)
    seq_len: int = Field(gt=0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    mlp_ratio: int = Field(default=4, gt=0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GPTConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@functools.lru_cache(maxsize=256)
def model_config(spec: ModelSpec) -> GPTConfig:
    """The worker's model config for a job's model spec (both frozen, so one object is shared:
    the planner asks for it thousands of times per quote and validation is the cost)."""
    return GPTConfig(
        n_layers=spec.n_layers,
        d_model=spec.d_model,
        n_heads=spec.n_heads,
        vocab=spec.vocab,
        seq_len=spec.seq_len,
    )


# How tensor parallelism shards one block, by module name inside the block (Megatron-style):
# column-parallel modules split their output features (weight rows and bias), row-parallel ones
# their input features (weight columns; the bias stays whole). Every other parameter (embeddings,
# norms, the lm_head) stays whole on every tp rank. ``training.parallel.parallelize.apply_tp``
# shards by it and the planner prices by it (``tp_local_shape``).
TP_PLAN: MappingProxyType[str, Literal["colwise", "rowwise"]] = MappingProxyType(
    {
        "attn.q": "colwise",
        "attn.k": "colwise",
        "attn.v": "colwise",
        "attn.proj": "rowwise",
        "mlp.fc": "colwise",
        "mlp.proj": "rowwise",
    }
)


def gpt_param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``GPT(cfg)`` by name, in its registration order (a test compares the
    built module's ``named_parameters``)."""
    d, r = cfg.d_model, cfg.mlp_ratio
    block: dict[str, tuple[int, ...]] = {"ln1.weight": (d,), "ln1.bias": (d,)}
    for name in ("q", "k", "v", "proj"):
        block |= {f"attn.{name}.weight": (d, d), f"attn.{name}.bias": (d,)}
    block |= {"ln2.weight": (d,), "ln2.bias": (d,)}
    block |= {"mlp.fc.weight": (r * d, d), "mlp.fc.bias": (r * d,)}
    block |= {"mlp.proj.weight": (d, r * d), "mlp.proj.bias": (d,)}
    out: dict[str, tuple[int, ...]] = {"tok_emb.weight": (cfg.vocab, d), "pos_emb.weight": (cfg.seq_len, d)}
    for i in range(cfg.n_layers):
        out |= {f"layers.{i}.{name}": shape for name, shape in block.items()}
    out |= {"norm.weight": (d,), "norm.bias": (d,), "lm_head.weight": (cfg.vocab, d)}
    return out


def tp_local_shape(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The shape one tp rank holds of parameter ``name`` (``TP_PLAN``; sizes divide evenly, as
    ``ParallelDims.check_model`` requires)."""
    parts = name.split(".")
    if tp == 1 or parts[0] != "layers":
        return shape
    style = TP_PLAN.get(".".join(parts[2:-1]))
    if style == "colwise":
        return (shape[0] // tp, *shape[1:])
    if style == "rowwise" and parts[-1] == "weight":
        return (shape[0], shape[1] // tp)
    return shape


def gpt_param_count(cfg: GPTConfig) -> int:
    """Parameters of ``GPT(cfg)``, exactly (a test builds the module over many shapes and compares).

    Per block: two LayerNorms (2·2d), q/k/v/proj with biases (4·(d²+d)), MLP fc and proj with
    biases (2·r·d² + r·d + d). Outside the blocks: token and position embeddings, the final
    LayerNorm, and an untied ``lm_head`` without bias.
    """
    d, r = cfg.d_model, cfg.mlp_ratio
    block = 4 * d + 4 * (d * d + d) + 2 * r * d * d + r * d + d
    return cfg.n_layers * block + cfg.vocab * d + cfg.seq_len * d + 2 * d + d * cfg.vocab


def gpt_block_param_count(cfg: GPTConfig) -> int:
    """Parameters of one transformer block (what a pipeline stage holds per layer)."""
    d, r = cfg.d_model, cfg.mlp_ratio
    return 4 * d + 4 * (d * d + d) + 2 * r * d * d + r * d + d


def matmul_param_count(cfg: GPTConfig) -> int:
    """Parameters that take part in a matmul per token: all but the embedding lookups (token and
    position); the untied lm_head is one."""
    return gpt_param_count(cfg) - cfg.vocab * cfg.d_model - cfg.seq_len * cfg.d_model


def train_flops_per_token(cfg: GPTConfig, activation_checkpointing: bool = False) -> float:
    """Training FLOPs per token: 6 per matmul parameter plus 12·L·s·d for attention scores.

    Recomputing the forward pass under activation checkpointing adds one forward: 8N + 16·L·s·d.
    The planner prices work with this and the agents' reference step measures its rate with it.
    """
    dense, attn = (8.0, 16.0) if activation_checkpointing else (6.0, 12.0)
    return dense * matmul_param_count(cfg) + attn * cfg.n_layers * cfg.seq_len * cfg.d_model
