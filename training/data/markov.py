"""A seeded synthetic language with an exactly known entropy floor.

An order-1 Markov chain over ``vocab`` tokens in which every state has only ``branching`` possible
successors (Dirichlet-weighted). One successor of state s is always (s + 1) mod vocab, so the chain is
irreducible and its stationary distribution unique. Sequences start from that stationary
distribution, so every predicted position has the same optimal expected loss: the entropy rate

    H = sum_s pi(s) * H(P(.|s))   (nats)

A model whose loss reaches H has learned everything there is to learn; uniform guessing costs
ln(vocab). With few successors per state the floor sits far below uniform and a small model gets
visibly close to it in a few hundred steps.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import sparse
from torch import Tensor


class MarkovSource:
    def __init__(self, vocab: int, seed: int = 0, branching: int = 4, concentration: float = 0.5) -> None:
        if vocab < 2:
            raise ValueError(f"vocab must be >= 2, got {vocab}")
        if not 1 <= branching <= vocab:
            raise ValueError(f"branching must be in [1, vocab={vocab}], got {branching}")
        if concentration <= 0:
            raise ValueError(f"concentration must be > 0, got {concentration}")
        self.vocab = vocab
        self.seed = seed
        self.branching = branching
        rng = np.random.default_rng(seed)
        succ = np.empty((vocab, branching), dtype=np.int64)
        for s in range(vocab):
            # The other successors: distinct, never (s + 1). Drawn as positions among the vocab - 1
            # tokens other than (s + 1), which is what choosing from that list draws, without
            # building the list (O(vocab) per state, O(vocab^2) in all: minutes at 128k tokens).
            nxt = (s + 1) % vocab
            picked = rng.choice(vocab - 1, size=branching - 1, replace=False)
            succ[s, 0] = nxt
            succ[s, 1:] = picked + (picked >= nxt)
        probs = rng.dirichlet(np.full(branching, concentration), size=vocab)
        # Floor tiny weights: every listed successor stays reachable (keeps the chain irreducible).
        probs = np.maximum(probs, 1e-3)
        probs /= probs.sum(axis=1, keepdims=True)
        self.successors = succ
        self.probs = probs
        # Sparse: ``branching`` entries per row (dense, a 128k vocabulary would need 137 GB).
        rows = np.repeat(np.arange(vocab), branching)
        self.transition = sparse.csr_array((probs.ravel(), (rows, succ.ravel())), shape=(vocab, vocab))
        self.stationary = _stationary(self.transition)
        row_entropy = -(probs * np.log(probs)).sum(axis=1)
        self.entropy_rate_nats = float(self.stationary @ row_entropy)
        self._succ_t = torch.from_numpy(succ)
        self._cdf_t = torch.from_numpy(np.cumsum(probs, axis=1)).to(torch.float64)
        self._pi_cdf_t = torch.from_numpy(np.cumsum(self.stationary)).to(torch.float64)

    def prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """P(nxt | prev), elementwise over two arrays of tokens (0 where the chain never steps)."""
        hit = self.successors[prev] == np.asarray(nxt)[..., None]
        return (self.probs[prev] * hit).sum(axis=-1)

    @property
    def uniform_nats(self) -> float:
        return math.log(self.vocab)

    def sample(self, batch: int, seq_len: int, generator: torch.Generator) -> Tensor:
        """``(batch, seq_len)`` int64 tokens from the stationary chain, reproducible from ``generator``."""
        u = torch.rand(seq_len, batch, generator=generator, dtype=torch.float64)
        out = torch.empty(batch, seq_len, dtype=torch.int64)
        state = torch.searchsorted(self._pi_cdf_t, u[0]).clamp_(max=self.vocab - 1)
        out[:, 0] = state
        for t in range(1, seq_len):
            choice = _inverse_cdf(self._cdf_t[state], u[t])
            state = self._succ_t[state, choice]
            out[:, t] = state
        return out


def _inverse_cdf(cdf: Tensor, u: Tensor) -> Tensor:
    idx = torch.searchsorted(cdf, u.unsqueeze(1)).squeeze(1)
    return idx.clamp_(max=cdf.shape[1] - 1)  # u within rounding of 1.0


def _stationary(p: sparse.csr_array, tol: float = 1e-15, max_iter: int = 100_000) -> np.ndarray:
    """Unique pi with pi P = pi, sum(pi) = 1, for an irreducible chain: power iteration on the lazy
    chain (P + I) / 2, which has the same pi and is aperiodic, until an update moves pi by less
    than ``tol`` (L1). A few hundred sparse products for these chains at any vocabulary (they mix
    fast); a dense linear solve is cubic in the vocabulary and holds vocab^2 floats."""
    n = p.shape[0]
    pt = p.T.tocsr()
    pi = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        nxt = 0.5 * (pi + pt @ pi)
        moved = float(np.abs(nxt - pi).sum())
        pi = nxt
        if moved < tol:
            return pi / pi.sum()
    raise RuntimeError(f"stationary distribution did not converge in {max_iter} steps (moved {moved:.2e})")
