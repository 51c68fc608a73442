"""What every mode's leader-side strategy provides to the engine and the node."""

from __future__ import annotations

import hashlib
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from contracts.errors import FailedPrecondition
from contracts.sync_config import SyncConfig
from training.compression.codecs import encode_tensor, get_codec
from training.sync.messages import InMessage, Meta, OutMessage, PushResult
from training.sync.node import RegionNode


def fingerprint(t: Tensor) -> str:
    # Hashed over the tensor's own memory: the same digest as over a bytes copy, without the copy.
    view = memoryview(t.detach().contiguous().numpy()).cast("B")
    return hashlib.blake2b(view, digest_size=8).hexdigest()


MAX_ROUND_SPANS = 10_000  # a 10k-round run's spans fit in a result of ~0.3 MB


class Strategy(ABC):
    stream = "base"

    def __init__(self, node: RegionNode, cfg: SyncConfig, weight: float, total_steps: int) -> None:
        self.node, self.cfg, self.weight, self.total_steps = node, cfg, weight, total_steps
        self.me = node.region
        self.codec = get_codec(cfg.compression, topk_ratio=cfg.topk_ratio, int8_block=cfg.int8_block)
        # Parameters (not updates) travel in float32, or bf16 when compression is on: int8/top-k
        # of raw weights would lose too much.
        self.param_codec = get_codec("fp32" if cfg.codec_name == "fp32" else "bf16")
        self.lock = threading.Condition()
        self.ready = False
        self.step = 0
        self.needs_catch_up = False
        self.latencies: list[float] = []  # seconds per completed exchange, since the last metrics call
        # (opened, completed) in unix seconds of the run's exchanges, the first MAX_ROUND_SPANS: a
        # benchmark intersects them with link counters (wire time per round).
        self.round_spans: list[tuple[float, float]] = []
        self.blocked_on_comm = 0.0

    # --- engine side
    def start(self, flat: Tensor, theta0: Tensor | None) -> None:
        """First event of this process: the initial parameters (``theta0``: the job's common
        initialisation when known, else None)."""
        self.ready = True

    @abstractmethod
    def on_event(self, step: int, flat: Tensor) -> Tensor | None: ...

    def progress(self) -> tuple[int, int]:
        """(rounds opened, rounds completed)."""
        return 0, 0

    def accepts(self, next_round: int) -> bool:
        return True

    def on_peer_joined(self, peer: str, next_round: int) -> None:
        return None

    @abstractmethod
    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def finish(self) -> None:
        return None

    # --- node side
    def handle_push(self, msg: InMessage) -> PushResult:
        raise FailedPrecondition(f"mode {self.cfg.mode!r} takes no pushes", field="stream")

    def handle_exchange(self, msg: InMessage) -> OutMessage:
        raise FailedPrecondition(f"mode {self.cfg.mode!r} takes no exchanges", field="stream")

    @abstractmethod
    def export_state(self, min_round: int, timeout: float) -> OutMessage: ...

    # --- helpers
    def wait_progress(self, min_round: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.progress()[1] < min_round:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FailedPrecondition(
                        f"{self.me} has not completed round {min_round} yet",
                        field="min_round",
                        completed=self.progress()[1],
                    )
                self.lock.wait(min(left, 0.5))

    def meta(self, round_index: int = 0, **kw: Any) -> Meta:
        return Meta(sender=self.me, stream=self.stream, round=round_index, step=self.step, **kw)

    def encode_params(self, t: Tensor) -> Any:
        return encode_tensor(t, self.param_codec, self.cfg.chunk_bytes)

    def encode_exact(self, t: Tensor) -> Any:
        return encode_tensor(t, get_codec("fp32"), self.cfg.chunk_bytes)

    def record_latency(self, seconds: float) -> None:
        now = time.time()
        with self.lock:
            self.latencies.append(seconds)
            if len(self.round_spans) < MAX_ROUND_SPANS:
                self.round_spans.append((now - seconds, now))

    def take_latencies(self) -> list[float]:
        with self.lock:
            out, self.latencies = self.latencies, []
        return out


def zeros_like(t: Tensor) -> Tensor:
    return torch.zeros_like(t)
