"""``async``: one region is the parameter server. Every H steps each region sends its update
(params - base, compressed with error feedback) with the server version it started from; the
server applies it at once, scaled by the region's weight and damped by how stale it is, and
answers with its current parameters. With ``overlap`` the answer is applied one round later,
keeping the local progress made meanwhile. No region ever waits for another one's compute.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch
from torch import Tensor

from training.compression.error_feedback import ErrorFeedback
from training.sync.algorithms.schedule import is_start
from training.sync.algorithms.staleness import async_scale
from training.sync.messages import InMessage, OutMessage
from training.sync.strategies.base import Strategy
from training.sync.transport import PeerError


class AsyncServer(Strategy):
    stream = "ps"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.ps = self.cfg.ps_region or self.node.regions[0]
        self.is_ps = self.ps == self.me
        self.ef = ErrorFeedback(self.codec, self.cfg.chunk_bytes, self.cfg.error_feedback)
        self.theta: Tensor | None = None  # server side
        self.version = 0
        self.base: Tensor | None = None  # worker side: the server parameters last received
        self.base_version = 0
        self.snapshot: Tensor | None = None
        self.pending: Future | None = None
        self.pending_residual: Tensor | None = None
        # Per server answer applied since the last metrics: rounds between the update's push and
        # the answer's landing (0 blocking, 1 with overlap).
        self.lag_rounds: list[int] = []

    def start(self, flat: Tensor, theta0: Tensor | None) -> None:
        init = (theta0 if theta0 is not None else flat).clone()
        if self.base is None:
            self.base = init.clone()
        if self.is_ps and self.theta is None:
            self.theta = self.base.clone()
            self.version = self.base_version
        super().start(flat, theta0)

    def progress(self) -> tuple[int, int]:
        v = self.version if self.is_ps else self.base_version
        return v, v

    # ------------------------------------------------------------ server side

    def _apply_update(self, update: Tensor, weight: float, based_on: int) -> tuple[Tensor, int]:
        with self.lock:
            assert self.theta is not None
            scale = async_scale(self.version - based_on, len(self.node.regions), self.cfg.async_damping)
            self.theta += (weight * scale) * update
            self.version += 1
            self.lock.notify_all()
            return self.theta.clone(), self.version

    def handle_exchange(self, msg: InMessage) -> OutMessage:
        if not self.is_ps or self.theta is None:
            from contracts.errors import FailedPrecondition

            raise FailedPrecondition(
                f"{self.me} is not the parameter server (that is {self.ps})", field="ps_region"
            )
        theta, version = self._apply_update(msg.tensors["update"], msg.meta.weight, msg.meta.version)
        return OutMessage(self.meta(version, version=version), [("params", self.encode_params(theta))])

    # ------------------------------------------------------------ worker side

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        final = step == self.total_steps
        if not (is_start(step, self.cfg.every) or final) or self.base is None:
            return None
        if self.pending is not None:
            flat = self._take(self.pending, flat)
            self.lag_rounds.append(1)
        enc, decoded, residual = self.ef.compress(flat - self.base)
        self.snapshot, self.pending_residual = flat.clone(), residual
        fut = self.node.pool.submit(self._push, enc, decoded)
        if self.cfg.overlap and not final:
            self.pending = fut
        else:
            flat = self._take(fut, flat)
            self.lag_rounds.append(0)
        return flat

    def _push(self, enc: Any, decoded: Tensor) -> tuple[Tensor, int] | None:
        t0 = time.monotonic()
        try:
            if self.is_ps:
                out = self._apply_update(decoded, self.weight, self.base_version)
            else:
                msg = OutMessage(
                    self.meta(self.base_version, weight=self.weight, version=self.base_version),
                    [("update", enc)],
                )
                reply = self.node.client(self.ps).exchange(msg, self.cfg.timeout_s)
                out = reply.tensors["params"], reply.meta.version
        except PeerError as e:
            self.node.mark_dead(self.ps, f"exchange failed: {e.status}")
            return None  # keep training locally; the update goes out with the next one
        self.record_latency(time.monotonic() - t0)
        return out

    def _take(self, fut: Future, flat: Tensor) -> Tensor:
        t0 = time.monotonic()
        res = fut.result()
        self.blocked_on_comm += time.monotonic() - t0
        self.pending = None
        if res is None:
            return flat
        theta, version = res
        assert self.snapshot is not None
        flat = theta + (flat - self.snapshot)
        with self.lock:
            self.base, self.base_version = theta, version
            self.ef.commit(self.pending_residual)
            self.lock.notify_all()
        return flat

    # ------------------------------------------------------------ catch-up, checkpoint

    def export_state(self, min_round: int, timeout: float) -> OutMessage:
        with self.lock:
            theta, v = (self.theta, self.version) if self.is_ps else (self.base, self.base_version)
            assert theta is not None
            theta = theta.clone()
        return OutMessage(self.meta(v, version=v), [("params", self.encode_exact(theta))])

    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor:
        params = msg.tensors["params"]
        with self.lock:
            self.base, self.base_version = params.clone(), msg.meta.version
            if self.is_ps:
                self.theta, self.version = params.clone(), msg.meta.version
            self.ef.commit(None)
            self.pending = None
        return params.clone()

    def catch_up_source(self, statuses: dict[str, Any]) -> str | None:
        return None if self.is_ps else self.ps

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {
                "mode": "async",
                "base_version": self.base_version,
                "base": None if self.base is None else self.base.clone(),
                "error_feedback": self.ef.state_dict(),
            }
            if self.is_ps and self.theta is not None:
                out |= {"theta": self.theta.clone(), "version": self.version}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.base_version = int(state.get("base_version", 0))
        self.base = None if state.get("base") is None else torch.as_tensor(state["base"]).float().clone()
        if self.is_ps and state.get("theta") is not None:
            self.theta, self.version = torch.as_tensor(state["theta"]).float().clone(), int(state["version"])
        self.ef.load_state_dict(state.get("error_feedback", {}))
