"""``gossip``: no global barrier. Every H steps a region mixes with a few peers chosen by a
(time-varying) graph, in the background, and folds in whatever mixing has completed.

- ``pairwise``: an Exchange with each chosen peer; both sides add opposite corrections
  ``w * (theirs - mine)`` (sum preserving, as in AD-PSGD), applied at their next event.
- ``push_sum``: the region keeps a mass ``w``; it keeps ``1/(k+1)`` of it and pushes ``(params,
  w/(k+1))`` to each of its k out-peers; received shares are folded as ``x += w_j z_j``,
  ``w += w_j`` and the parameters are ``x / w`` (Kempe et al. 2003; SGP, Assran et al. 2019).

Gossip alone never ends on one model, so every ``gossip_check_every`` rounds the regions measure
their spread (the largest distance of a region's parameters from the regions' mean, on a sample
of coordinates every region draws alike) and, when it is above ``gossip_max_spread``, replace their
parameters by the exact mean. The last step always ends with the exact mean, so the job's result is
one model. Checks and the final mean are barriers, bounded by the timeouts like any exchange.

The final mean has streams of its own, keyed by nothing a region counts: every region meets there at
its last step whatever its round counter says. (A region that took a peer's state at its join holds
that peer's counter from the moment of the pull; keyed by the counter, one round apart, the regions
would each wait for a contribution the others send under another key until the start-up timeout.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch import Tensor

from contracts.errors import FailedPrecondition
from training.compression.codecs import get_codec
from training.sync.algorithms.gossip import pairwise_correction, peers_for_round, push_sum_combine
from training.sync.algorithms.schedule import is_start
from training.sync.collective import DenseReducer
from training.sync.messages import InMessage, Meta, OutMessage, PushResult
from training.sync.strategies.base import Strategy
from training.sync.transport import PeerError


class GossipSync(Strategy):
    stream = "gossip"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        k = self.cfg.gossip_peers
        self.mix_weight = self.cfg.gossip_weight or 1.0 / (2 * k + 1)
        self.rounds = 0
        self.public: Tensor | None = None  # parameters as of the last event (what exchanges see)
        self.corrections: list[Tensor] = []  # pairwise: to add at the next event
        self.shares: list[tuple[Tensor, float]] = []  # push-sum: received (z, w) and refunded shares
        self.mass = 1.0
        self.busy: set[str] = set()
        self.busy_lock = threading.Lock()
        fp32, c = get_codec("fp32"), self.cfg
        self.averager = DenseReducer(self.node, "gavg", fp32, c.chunk_bytes, False, c.ring_order)
        self.checker = DenseReducer(self.node, "gcheck", fp32, c.chunk_bytes, False, c.ring_order)
        self.exact = DenseReducer(self.node, "gexact", fp32, c.chunk_bytes, False, c.ring_order)
        self.end_avg = DenseReducer(self.node, "gfinal", fp32, c.chunk_bytes, False, c.ring_order)
        self.end_check = DenseReducer(self.node, "gfinalck", fp32, c.chunk_bytes, False, c.ring_order)
        self.public_step = 0  # the step ``public`` and ``rounds`` are as of (what a pull reports)
        self.spread: float | None = None  # at the last check, since the last metrics call

    SAMPLE = 65_536  # coordinates a periodic check compares

    END_ROUND = 2**62  # the final mean's streams carry one round, after any a peer is included from

    def _deviations(
        self, checker: DenseReducer, r: int, step: int, x: Tensor, mine: Tensor, timeout: float
    ) -> float:
        """Every region's max distance from the mean (over ``x``'s coordinates), the largest."""
        dev = float((mine - x).abs().max()) if x.numel() else 0.0
        res = checker.reduce(r, torch.zeros(1), self.weight, repr(dev), step, timeout)
        return max(float(v) for v in res.fingerprints.values())

    def _check(self, r: int, step: int, flat: Tensor, final: bool) -> Tensor:
        """Measure the spread; return the exact mean if it is the end or the spread is too large."""
        timeout = max(self.cfg.timeout_s, self.cfg.startup_timeout_s) if final else self.cfg.timeout_s
        if final or flat.numel() <= self.SAMPLE:
            idx = None
        else:
            gen = torch.Generator().manual_seed(r)
            idx = torch.randperm(flat.numel(), generator=gen)[: self.SAMPLE]
        sample = flat if idx is None else flat[idx]
        if final:
            r = self.END_ROUND
        averager, checker = (self.end_avg, self.end_check) if final else (self.averager, self.checker)
        mean = averager.reduce(r, sample, self.weight, "", step, timeout).avg
        self.spread = self._deviations(checker, r, step, mean, sample, timeout)
        bound = self.cfg.gossip_max_spread
        if final:
            return mean  # the same bits in every region: the job's one model
        if bound is not None and self.spread > bound:
            return mean if idx is None else self.exact.reduce(r, flat, self.weight, "", step, timeout).avg
        return flat

    def progress(self) -> tuple[int, int]:
        return self.rounds, self.rounds

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        final = step == self.total_steps
        if not (is_start(step, self.cfg.every) or final):
            return None
        if final:  # let what is in flight land, then fold it in
            deadline = time.monotonic() + self.cfg.timeout_s
            while self.busy and time.monotonic() < deadline:
                time.sleep(0.01)
        with self.lock:
            if self.cfg.gossip_protocol == "pairwise":
                for c in self.corrections:
                    flat += c
                self.corrections = []
            else:
                x, self.mass = push_sum_combine(flat * self.mass, self.mass, self.shares)
                flat = x / self.mass
                self.shares = []
            r = self.rounds
        if final or (r > 0 and r % self.cfg.gossip_check_every == 0):
            flat = self._check(r, step, flat, final)
        with self.lock:
            self.public = flat.clone()
            self.public_step = step
            self.rounds += 1
            self.lock.notify_all()
        if not final:
            peers = [
                p
                for p in peers_for_round(
                    self.node.regions, self.me, r, self.cfg.gossip_peers, self.cfg.gossip_graph
                )
                if p not in self.node.left
            ]
            if self.cfg.gossip_protocol == "pairwise":
                for p in peers:
                    self._launch(p, self._pairwise, p, r)
            elif peers:
                share = self.mass / (len(peers) + 1)
                self.mass = share
                for p in peers:
                    self._launch(p, self._push_share, p, r, share)
        return flat

    def _launch(self, peer: str, fn: Any, *args: Any) -> None:
        with self.busy_lock:
            if peer in self.busy:  # still mixing with this peer from an earlier round
                if fn == self._push_share:  # keep the share: refund it now
                    with self.lock:
                        self.shares.append((self.public.clone(), args[2]))  # type: ignore[union-attr]
                return
            self.busy.add(peer)

        def run() -> None:
            try:
                fn(*args)
            finally:
                with self.busy_lock:
                    self.busy.discard(peer)

        self.node.pool.submit(run)

    def _pairwise(self, peer: str, r: int) -> None:
        assert self.public is not None
        mine = self.public
        msg = OutMessage(self.meta(r, weight=self.mix_weight), [("params", self.encode_params(mine))])
        t0 = time.monotonic()
        try:
            reply = self.node.client(peer).exchange(msg, self.cfg.timeout_s)
        except PeerError:
            return  # no barrier: try another peer next round
        self.record_latency(time.monotonic() - t0)
        with self.lock:
            self.corrections.append(pairwise_correction(mine, reply.tensors["params"], self.mix_weight))

    def _push_share(self, peer: str, r: int, share: float) -> None:
        assert self.public is not None
        z = self.public
        msg = OutMessage(self.meta(r, weight=share), [("params", self.encode_params(z))])
        t0 = time.monotonic()
        try:
            ack = self.node.client(peer).push(msg, self.cfg.timeout_s)
            ok = ack.accepted
        except PeerError:
            ok = False
        if ok:
            self.record_latency(time.monotonic() - t0)
        else:
            with self.lock:  # the mass never left: take it back
                self.shares.append((z, share))

    def handle_exchange(self, msg: InMessage) -> OutMessage:
        with self.lock:
            if self.public is None:
                raise FailedPrecondition(f"{self.me} has no parameters to mix yet", field="stream")
            mine = self.public
            self.corrections.append(pairwise_correction(mine, msg.tensors["params"], msg.meta.weight))
        return OutMessage(self.meta(self.rounds), [("params", self.encode_params(mine))])

    def handle_push(self, msg: InMessage) -> PushResult:
        if msg.meta.stream.startswith(("gavg", "gcheck", "gexact", "gfinal")):
            self.node.deliver(msg)
            return PushResult(True, "", self.rounds)
        with self.lock:
            self.shares.append((msg.tensors["params"], msg.meta.weight))
        return PushResult(True, "", self.rounds)

    def export_state(self, min_round: int, timeout: float) -> OutMessage:
        with self.lock:
            if self.public is None:
                raise FailedPrecondition(f"{self.me} has no parameters yet", field="stream")
            params, r, step = self.public.clone(), self.rounds, self.public_step
        # The step the parameters and the round counter are as of (``self.step`` moves on at the
        # start of an event, before the round is counted): a region taking this state resumes there.
        meta = Meta(sender=self.me, stream=self.stream, round=r, step=step)
        return OutMessage(meta, [("params", self.encode_exact(params))])

    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor:
        with self.lock:
            self.rounds = msg.meta.round
            self.corrections, self.shares, self.mass = [], [], 1.0
            self.public = msg.tensors["params"].clone()
            self.public_step = msg.meta.step
        return self.public.clone()

    def take_spread(self) -> float | None:
        out, self.spread = self.spread, None
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"mode": "gossip", "rounds": self.rounds, "mass": self.mass}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.rounds, self.mass = int(state.get("rounds", 0)), float(state.get("mass", 1.0))
