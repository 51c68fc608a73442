"""Messages between region leaders, as plain data (the transport frames them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from training.compression.codecs import EncodedTensor


@dataclass
class Meta:
    sender: str
    stream: str
    round: int = 0
    weight: float = 0.0
    version: int = 0
    seq: int = 0
    base_seq: int = 0
    fingerprint: str = ""
    step: int = 0
    step_s: float = 0.0  # balancing figures of the contribution's origin (see sync.proto Header)
    opened_at: float = 0.0


@dataclass
class OutMessage:
    """To send: metadata and named encoded tensors."""

    meta: Meta
    parts: list[tuple[str, EncodedTensor]] = field(default_factory=list)

    @property
    def payload_bytes(self) -> int:
        return sum(enc.nbytes for _, enc in self.parts)


@dataclass
class InMessage:
    """Received: metadata, named decoded float32 tensors, and the encodings they came in (a ring
    forwards those bytes unchanged, so every region decodes exactly the same values)."""

    meta: Meta
    tensors: dict[str, Tensor] = field(default_factory=dict)
    nbytes: int = 0
    encoded: dict[str, EncodedTensor] = field(default_factory=dict)


@dataclass(frozen=True)
class PushResult:
    accepted: bool
    reason: str = ""
    progress: int = 0


@dataclass(frozen=True)
class PeerStatus:
    region: str
    ready: bool
    progress: int  # rounds opened
    completed: int  # rounds completed
    step: int
    mode: str
    accepted: bool = False
    include_from: int = 0
