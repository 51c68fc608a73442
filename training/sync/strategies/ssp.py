"""``ssp``: stale-synchronous parallel between regions.

Every H steps a region sends its update (params - base, compressed with error feedback) to every
peer and folds in, scaled by each region's weight, its own and every peer update that has
arrived. It blocks only when some peer's last delivered clock is more than ``staleness`` behind its
own, so a fast region runs at most ``staleness`` rounds ahead. All regions fold in the same
decoded updates, so their views differ only by what is still in flight.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from training.compression.error_feedback import ErrorFeedback
from training.sync.algorithms.schedule import is_start
from training.sync.algorithms.staleness import ssp_ready
from training.sync.messages import InMessage, OutMessage, PushResult
from training.sync.strategies.base import Strategy
from training.sync.transport import PeerError


class StaleSync(Strategy):
    stream = "ssp"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.ef = ErrorFeedback(self.codec, self.cfg.chunk_bytes, self.cfg.error_feedback)
        self.base: Tensor | None = None
        self.clock = 0  # rounds done
        self.delivered = dict.fromkeys(self.node.peers, -1)  # last contiguous clock received per peer
        self.pending: dict[str, dict[int, tuple[Tensor, float]]] = {p: {} for p in self.node.peers}
        # One sender per peer keeps a peer's updates in clock order.
        self.senders = {p: ThreadPoolExecutor(1, thread_name_prefix=f"ssp-{p}") for p in self.node.peers}
        # Per event since the last metrics: clocks this region went on ahead of the slowest live
        # peer's last delivered one (the bound keeps it <= staleness).
        self.ahead: list[int] = []

    def start(self, flat: Tensor, theta0: Tensor | None) -> None:
        if self.base is None:
            self.base = (theta0 if theta0 is not None else flat).clone()
        super().start(flat, theta0)

    def progress(self) -> tuple[int, int]:
        return self.clock, self.clock

    def accepts(self, next_round: int) -> bool:
        return self.clock <= next_round

    def on_peer_joined(self, peer: str, next_round: int) -> None:
        with self.lock:
            self.delivered[peer] = next_round - 1
            self.pending[peer] = {}

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        final = step == self.total_steps
        if not (is_start(step, self.cfg.every) or final) or self.base is None:
            return None
        c = self.clock
        enc, decoded, residual = self.ef.compress(flat - self.base)
        self.ef.commit(residual)
        msg = OutMessage(self.meta(c, weight=self.weight), [("update", enc)])
        t0 = time.monotonic()
        for p in self.node.participants(c):
            self.senders[p].submit(self._send, p, msg)
        # Block while a peer is more than `staleness` clocks behind (at the end: until all are in).
        bound = 0 if final else self.cfg.staleness
        deadline = time.monotonic() + self.cfg.timeout_s
        with self.lock:
            while True:
                live = {p: self.delivered[p] for p in self.node.participants(c)}
                behind = ssp_ready(c, live, bound)
                left = deadline - time.monotonic()
                if not behind or left <= 0:
                    break
                for p in behind:  # a killed peer is dropped at once, not after the timeout
                    self.node.check_gone(p)
                self.lock.wait(min(left, 0.2))
            if not behind and live:
                self.ahead.append(c - min(live.values()))
            new = self.base + self.weight * decoded
            for p in self.pending:
                for _, (u, w) in sorted(self.pending[p].items()):
                    new += w * u
                self.pending[p].clear()
            self.base = new.clone()
            self.clock = c + 1
            self.lock.notify_all()
        for p in behind:
            self.node.mark_dead(p, f"more than {bound} clocks behind for {self.cfg.timeout_s}s")
        waited = time.monotonic() - t0
        self.blocked_on_comm += waited
        self.record_latency(waited)
        return new

    def _send(self, peer: str, msg: OutMessage) -> None:
        try:
            ack = self.node.client(peer).push(msg, self.cfg.timeout_s)
            if not ack.accepted and ack.reason == "stale":
                self.needs_catch_up = True
        except PeerError as e:
            self.node.mark_dead(peer, f"push failed: {e.status}")

    def handle_push(self, msg: InMessage) -> PushResult:
        p, c = msg.meta.sender, msg.meta.round
        with self.lock:
            if c <= self.delivered[p]:
                return PushResult(False, "stale", self.clock)
            self.pending[p][c] = (msg.tensors["update"], msg.meta.weight)
            while self.delivered[p] + 1 in self.pending[p]:
                self.delivered[p] += 1
            self.lock.notify_all()
        return PushResult(True, "", self.clock)

    def export_state(self, min_round: int, timeout: float) -> OutMessage:
        self.wait_progress(min_round, timeout)
        with self.lock:
            assert self.base is not None
            base, clock = self.base.clone(), self.clock
        return OutMessage(self.meta(clock), [("base", self.encode_exact(base))])

    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor:
        with self.lock:
            self.base = msg.tensors["base"].clone()
            self.clock = msg.meta.round
            for p in self.pending:
                self.pending[p].clear()
                self.delivered[p] = self.clock - 1
            self.ef.commit(None)
        return self.base.clone()

    def finish(self) -> None:
        for ex in self.senders.values():  # deliver what is queued (each push has a deadline)
            ex.shutdown(wait=True)

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": "ssp",
                "clock": self.clock,
                "base": None if self.base is None else self.base.clone(),
                "error_feedback": self.ef.state_dict(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.clock = int(state.get("clock", 0))
        self.base = None if state.get("base") is None else torch.as_tensor(state["base"]).float().clone()
        self.ef.load_state_dict(state.get("error_feedback", {}))
