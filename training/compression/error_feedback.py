"""Error feedback: what a lossy codec dropped this time is added to what is sent next time, so no
part of an update is lost for good (Seide et al. 2014; Karimireddy et al. 2019)."""

from __future__ import annotations

import torch
from torch import Tensor

from training.compression.codecs import Codec, EncodedTensor, decode_tensor, encode_tensor


class ErrorFeedback:
    def __init__(self, codec: Codec, chunk_bytes: int, enabled: bool = True) -> None:
        self.codec, self.chunk_bytes, self.enabled = codec, chunk_bytes, enabled
        self.residual: Tensor | None = None

    def compress(self, x: Tensor) -> tuple[EncodedTensor, Tensor, Tensor | None]:
        """Encode ``x`` plus the carried residual. Returns the encoding, its decoded value (what
        every receiver will see) and the residual to keep if the send succeeds (``commit``)."""
        target = x if self.residual is None or not self.enabled else x + self.residual
        enc = encode_tensor(target, self.codec, self.chunk_bytes)
        # float32 travels exactly: its decoding is the value itself (no decode pass, no copy).
        exact = self.codec.name == "fp32"
        decoded = target.detach().reshape(-1).float() if exact else decode_tensor(enc, self.codec)
        residual = (target - decoded) if self.enabled and self.codec.name != "fp32" else None
        return enc, decoded, residual

    def commit(self, residual: Tensor | None) -> None:
        self.residual = residual

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.residual is None else {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        r = state.get("residual")
        self.residual = None if r is None else torch.as_tensor(r, dtype=torch.float32).clone()
