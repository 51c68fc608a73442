"""A GPT decoder in the nanoGPT mould, kept pure: no parallelism, no data, no I/O.

Shaped for sharding by name:
- attention has separate ``q``/``k``/``v`` projections and an output ``proj``; the MLP has ``fc`` and
  ``proj``. Column-parallel q/k/v/fc and row-parallel proj need no change here, because attention
  infers its local head count from the projected width (``n_heads / tp`` heads per rank).
- ``layers`` is a ModuleDict keyed "0".."L-1", so a pipeline stage that drops layers, the embeddings
  or the head keeps the same parameter names as the full model (checkpoints stay interchangeable).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from contracts.model import GPTConfig


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp of them.
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Decoder-only transformer.

    The full model maps token ids to ``(logits, loss)`` (loss is None without targets). A pipeline
    stage (see ``training.parallel.pipeline``) has ``tok_emb`` and/or ``lm_head`` set to None and
    maps one bare activation tensor to the next: hidden states in, hidden states or logits out.
    """

    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        # Recompute each block's activations in backward instead of keeping them (set by the
        # runtime from the worker config; parameter names stay those of the plain model).
        self.activation_checkpointing = False
        self.init_weights(seed)

    @property
    def is_stage(self) -> bool:
        return self.tok_emb is None or self.lm_head is None

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Same seed, same weights, on any device: draws come from a private CPU generator."""
        gen = torch.Generator().manual_seed(seed)
        # GPT-2 scaling: residual output projections shrink with depth so the stream stays O(1).
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("norm."):
                p.fill_(1.0)
            else:
                std = resid_std if name.endswith("proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor | None]:
        if self.tok_emb is not None:
            assert self.pos_emb is not None
            pos = torch.arange(idx.shape[1], device=idx.device)
            h = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        else:
            h = idx  # a later pipeline stage receives hidden states
        for layer in self.layers.values():
            if self.activation_checkpointing and torch.is_grad_enabled():
                h = checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        if self.lm_head is None:
            return h
        assert self.norm is not None
        logits = self.lm_head(self.norm(h))
        if self.is_stage:
            return logits
        loss = None if targets is None else lm_loss(logits, targets)
        return logits, loss

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy in nats."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
