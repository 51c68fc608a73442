"""The ring all-reduce's arithmetic in one process: what ``collective.DenseReducer`` computes for
R regions, without the network. Each reduce-scatter hop compresses a running partial sum of one
chunk, part by part, with error feedback kept per (region, hop, part); the owner of a fully summed
chunk averages it and encodes it once, and every region uses those decoded values. Calibration
(``training.calibration``) runs rounds through it so a codec's loss is measured with the
same compression points, codec, chunking and residuals a real exchange applies."""

from __future__ import annotations

import torch
from torch import Tensor

from training.compression.codecs import Codec
from training.compression.error_feedback import ErrorFeedback
from training.sync.algorithms.ring import owned_chunk, reduce_scatter_step
from training.sync.algorithms.schedule import fragment_slices
from training.sync.pipeline import part_slices


class RingSim:
    """Rounds of the ring average over ``regions`` contributions of one flat size."""

    def __init__(self, codec: Codec, chunk_bytes: int, error_feedback: bool = True) -> None:
        self.codec, self.chunk_bytes, self.error_feedback = codec, chunk_bytes, error_feedback
        self.hops: dict[tuple[int, str, int, int], ErrorFeedback] = {}

    def _send(self, key: tuple[int, str, int, int], x: Tensor) -> Tensor:
        """What the receiver decodes of ``x``; its residual carried into the same hop next round."""
        if self.codec.name == "fp32":
            return x.clone()
        ef = self.hops.get(key)
        if ef is None:
            ef = self.hops[key] = ErrorFeedback(self.codec, self.chunk_bytes, self.error_feedback)
        _, decoded, residual = ef.compress(x)
        ef.commit(residual)
        return decoded

    def _parts(self, key: tuple[int, str, int], x: Tensor, chunk: slice, hint: int) -> Tensor:
        """``x`` (one ring chunk's values) sent in the parts the pipeline cuts it into."""
        out = torch.empty_like(x)
        for j, part in enumerate(part_slices(chunk, hint)):
            local = slice(part.start - chunk.start, part.stop - chunk.start)
            out[local] = self._send((*key, j), x[local])
        return out

    def mean(self, xs: list[Tensor]) -> Tensor:
        """The equal-weight average of ``xs`` as every region decodes it."""
        size = len(xs)
        n = xs[0].numel()
        chunks = fragment_slices(n, size)
        hint = n // size
        if size == 1:
            return self._parts((0, "ag", 0), xs[0], chunks[0], hint)
        # running[i]: the partial sum region i sends at the next hop (its own chunk at hop 0).
        running = {i: xs[i][chunks[i]].clone() for i in range(size)}
        for k in range(size - 1):
            sent = {}
            for i in range(size):
                send_c, _ = reduce_scatter_step(i, k, size)
                sent[(i + 1) % size] = self._parts((i, "rs", k), running[i], chunks[send_c], hint)
            for i in range(size):
                _, recv_c = reduce_scatter_step(i, k, size)
                running[i] = sent[i] + xs[i][chunks[recv_c]]
        out = torch.empty(n, dtype=torch.float32)
        for i in range(size):
            own = owned_chunk(i, size)
            out[chunks[own]] = self._parts((i, "ag", 0), running[i] / size, chunks[own], hint)
        return out
