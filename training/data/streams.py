"""Per-replica batch streams and the data-residency rule.

Every data-parallel replica in the job has a global index (``sync.replica_offset`` + local dp rank)
and reads its own stream. Batch ``step`` of replica ``r`` is a pure function of (seed, r, step), so a
run resumed from a checkpoint sees exactly the batches it would have seen without stopping, and a
single-process reference can reproduce any replica's batches.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from contracts.errors import InvalidArgument, PermissionDenied
from contracts.worker_config import DataSpec
from training.data.markov import MarkovSource
from training.data.tokens import TokenFile


class BatchStream(Protocol):
    def batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        """Inputs and next-token targets, each ``(batch_size, seq_len)`` int64."""
        ...


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (nearby inputs give unrelated streams)."""
    return int(
        np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0] >> 1
    )


def _generator(seed: int, replica: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, replica, step))


class MarkovStream:
    def __init__(self, source: MarkovSource, seq_len: int, seed: int, replica: int) -> None:
        self.source, self.seq_len, self.seed, self.replica = source, seq_len, seed, replica

    def batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        seqs = self.source.sample(batch_size, self.seq_len + 1, _generator(self.seed, self.replica, step))
        return seqs[:, :-1], seqs[:, 1:]


class TokenStream:
    """Random windows from this replica's own contiguous shard of a token file (shards are disjoint)."""

    def __init__(
        self, tokens: TokenFile, seq_len: int, vocab: int, seed: int, replica: int, replicas: int
    ) -> None:
        shard = len(tokens) // replicas
        if shard < seq_len + 1:
            raise InvalidArgument(
                f"token file {tokens.path} has {len(tokens)} tokens: {replicas} replicas x"
                f" (seq_len + 1 = {seq_len + 1}) needs at least {replicas * (seq_len + 1)}",
                field="data.path",
            )
        self.tokens, self.seq_len, self.vocab, self.seed, self.replica = tokens, seq_len, vocab, seed, replica
        self.start = replica * shard
        self.n_windows = shard - seq_len  # start offsets inside the shard that fit a full window

    def batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        g = _generator(self.seed, self.replica, step)
        offsets = torch.randint(self.n_windows, (batch_size,), generator=g) + self.start
        seqs = torch.stack([self.tokens.window(int(o), self.seq_len + 1) for o in offsets])
        if int(seqs.max()) >= self.vocab:
            raise InvalidArgument(
                f"token file {self.tokens.path} holds id {int(seqs.max())} >= model.vocab ({self.vocab})",
                field="model.vocab",
            )
        return seqs[:, :-1], seqs[:, 1:]


def check_residency(spec: DataSpec, worker_region: str) -> None:
    """A dataset pinned to a region is read only there; only model updates ever leave it."""
    if spec.region is not None and spec.region != worker_region:
        raise PermissionDenied(
            f"dataset is pinned to region {spec.region!r}; a worker in region {worker_region!r}"
            " may not read it",
            field="data.region",
            data_region=spec.region,
            worker_region=worker_region,
        )


def build_stream(
    spec: DataSpec, *, worker_region: str, vocab: int, seq_len: int, replica: int, replicas: int
) -> BatchStream:
    if not 0 <= replica < replicas:
        raise InvalidArgument(f"replica index {replica} outside [0, {replicas})", field="sync.replica_offset")
    check_residency(spec, worker_region)
    if spec.kind == "synthetic-markov":
        source = MarkovSource(
            vocab, seed=spec.seed, branching=min(spec.branching, vocab), concentration=spec.concentration
        )
        return MarkovStream(source, seq_len, spec.seed, replica)
    if spec.kind == "tokens":
        assert spec.path is not None
        return TokenStream(TokenFile(spec.path, spec.dtype), seq_len, vocab, spec.seed, replica, replicas)
    raise InvalidArgument(f"data.kind {spec.kind!r} is not a built-in stream", field="data.kind")
