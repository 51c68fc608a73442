"""``sync``: synchronous data parallelism across regions. Every step, after the cluster has
averaged its gradients with torch.distributed, the leaders average them between regions (weighted
by replicas; a ring with 3+ regions; optionally compressed with error feedback) and every region
takes the same optimizer step on the same gradient, so the replicas stay one model.

Parameters cross the WAN only to check that: at the first and the last step the regions compare
parameter fingerprints. At a process's first check a region that differs (a model initialised
differently, or resumed without the step's checkpoint) takes the lowest-named region's parameters;
at any later one a difference fails the run with its step: some step ran on other gradients.
Optimizer state needs no repair: it was built from the averaged gradient, the same everywhere.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from contracts.errors import FailedPrecondition
from training.compression.codecs import get_codec
from training.sync.collective import DenseReducer
from training.sync.messages import InMessage, OutMessage, PushResult
from training.sync.strategies.base import Strategy, fingerprint
from training.sync.transport import PeerError


class GradSync(Strategy):
    stream = "grad"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        c = self.cfg
        self.reducer = DenseReducer(
            self.node,
            "grad",
            self.codec,
            c.chunk_bytes,
            c.error_feedback,
            c.ring_order,
            list(c.hierarchy.values()),
        )
        self.checker = DenseReducer(
            self.node,
            "check",
            get_codec("fp32"),
            c.chunk_bytes,
            False,
            c.ring_order,
            list(c.hierarchy.values()),
        )
        self.completed = 0  # the last step whose gradient was averaged
        self.public: Tensor | None = None  # parameters at the last check (what a peer pulls)
        self.public_round = -1
        self.identical: bool | None = None  # at the last check, before any repair
        self.checks = 0  # parameter checks this process has made
        # Its first check took a peer's parameters (not its optimizer state): later differences
        # follow from that repair and are repaired again, not failed.
        self.repaired = False

    def progress(self) -> tuple[int, int]:
        return self.completed, self.completed

    def reduce(self, step: int, grad: Tensor) -> Tensor:
        t0 = time.monotonic()
        res = self.reducer.reduce(step, grad, self.weight, "", step, self.cfg.timeout_s)
        if res.stale:
            raise FailedPrecondition(
                f"sync: region {self.me} is behind its peers at step {step}; "
                "a synchronous job resumes all regions from one checkpoint",
                field="sync.mode",
            )
        self.completed = step
        latency = time.monotonic() - t0
        self.record_latency(latency)
        self.blocked_on_comm += latency
        return res.avg

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        fp = fingerprint(flat)
        with self.lock:
            self.public, self.public_round = flat.clone(), step
            self.lock.notify_all()
        res = self.checker.reduce(step, torch.zeros(1), self.weight, fp, step, self.cfg.timeout_s)
        self.identical = len(set(res.fingerprints.values())) == 1
        self.checks += 1
        if self.checks == 1:
            self.repaired = not self.identical
        if not self.identical and self.checks > 1 and not self.repaired:
            raise FailedPrecondition(
                f"sync: the regions' replicas differ at step {step} (fingerprints "
                f"{dict(sorted(res.fingerprints.items()))}); mode 'sync' keeps one model, so some step "
                "since the first ran on other gradients or parameters",
                field="sync.mode",
                step=step,
            )
        root = min(res.fingerprints)
        if res.fingerprints[root] == fp:
            return None
        try:
            msg = self.node.client(root).pull("state", step, timeout=self.cfg.timeout_s)
        except PeerError as e:
            self.node.mark_dead(root, f"parameter repair failed: {e.status}")
            return None
        return self.adopt(msg, flat)

    def handle_push(self, msg: InMessage) -> PushResult:
        if msg.meta.round < self.completed and msg.meta.stream.startswith("grad"):
            return PushResult(False, "stale", self.completed)
        self.node.deliver(msg)
        return PushResult(True, "", self.completed)

    def export_state(self, min_round: int, timeout: float) -> OutMessage:
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.public is None or self.public_round < min_round:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FailedPrecondition(
                        f"{self.me} has no parameters of step {min_round} yet", field="min_round"
                    )
                self.lock.wait(min(left, 0.5))
            params, rnd = self.public.clone(), self.public_round
        return OutMessage(self.meta(rnd), [("params", self.encode_exact(params))])

    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor:
        return msg.tensors["params"].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"mode": "sync", "round": self.completed, "reducer": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.completed = int(state.get("round", 0))
            self.reducer.load_state_dict(state.get("reducer", {}))
