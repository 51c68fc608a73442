"""``local_sgd`` and ``diloco``: every region keeps the same anchor; each round the regions
average their pseudo-gradients (anchor - local params, compressed with error feedback; a ring with
3+ regions, ``training.sync.collective``) and an outer optimizer moves the anchor.

``local_sgd`` averages every H steps, ``diloco`` every H steps with outer Nesterov SGD. A blocking
round assigns the new anchor to the parameters, so the regions hold bit-identical replicas after
it. With ``overlap`` a round's exchange runs in the background and is applied ``delay`` steps
later, keeping the local progress made meanwhile (params = new anchor + progress since the
snapshot). With ``adaptive`` the delay follows the exchanges as they run (``adaptive_delay``):
each region's contribution to a round carries how many of its steps its previous overlapped
exchange took, and once a round's result is in, every region sets that round's delay (and the
floor of the next) from the same figures, so all apply it at the same step. With ``fragments``
the parameters are split and each fragment syncs on its own staggered schedule (Streaming
DiLoCo). The last step always ends with a blocking round.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from training.sync.algorithms.outer import outer_step
from training.sync.algorithms.schedule import fragment_of, fragment_slices, is_start
from training.sync.collective import DenseReducer
from training.sync.messages import InMessage, OutMessage, PushResult
from training.sync.strategies.base import Strategy, fingerprint


@dataclass
class _Result:
    avg: Tensor
    fingerprints: dict[str, str]
    latency: float


@dataclass
class _Round:
    index: int
    fragment: int
    snapshot: Tensor
    open_step: int
    wait_step: int  # by this step the result must be in (a region without it waits for it)
    apply_step: int | None  # None until the result says when (adaptive delay)
    blocking: bool  # applied at once: the new anchor is assigned
    future: Any
    opened_at: float = 0.0
    result: _Result | None = None


TAG_SEP = "~"  # a contribution's fingerprint tag: "<anchor fingerprint>~<steps its last exchange took>"


def adaptive_delay(current: int, needs: dict[str, int], round_steps: int) -> int:
    """A round's delay in steps from the shared figures: the most steps any region's previous
    overlapped exchange took, never below ``current`` (the delay every region waited at this
    round, at first the planner's), never beyond the round's last step. Pure and the same on
    every region given the same figures, so the regions apply the round at the same step; never
    decreasing, so the step at which a region waits for a result is never past its apply step."""
    cap = max(current, round_steps - 1)
    return int(min(cap, max([current, *needs.values()])))


class AnchoredSync(Strategy):
    stream = "anchored"
    admits_late = True  # a peer that joins mid-round is included from the next round

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        c = self.cfg
        self.lr, self.mu = c.effective_outer_lr, c.effective_outer_momentum
        self.round_steps, self.delay = c.round_steps, c.delay_steps
        self.adaptive = False  # set by the engine where every rank of the region can follow it
        self.last_need = 0  # steps this region's last overlapped exchange took (0: none yet)
        self.landed: dict[int, int] = {}  # round -> step it was applied at
        self.anchor: Tensor | None = None
        self.slices: list[slice] = []
        self.momentum: list[Tensor | None] = [None] * c.fragments
        self.reducers = [
            DenseReducer(self.node, f"anchored{f}", self.codec, c.chunk_bytes, c.error_feedback, c.ring_order)
            for f in range(c.fragments)
        ]
        self.opened = self.completed = 0
        self.inflight: deque[_Round] = deque()
        self.public: dict[str, Tensor] = {}

    # ------------------------------------------------------------ engine side

    def start(self, flat: Tensor, theta0: Tensor | None) -> None:
        if self.anchor is None:
            self.anchor = (theta0 if theta0 is not None else flat).clone()
        self.slices = fragment_slices(self.anchor.numel(), self.cfg.fragments)
        self._publish()
        super().start(flat, theta0)

    def progress(self) -> tuple[int, int]:
        return self.opened, self.completed

    def accepts(self, next_round: int) -> bool:
        return self.opened <= next_round

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        final = step == self.total_steps
        changed = False
        while self.inflight:
            rnd = self.inflight[0]
            if not final and step < rnd.wait_step:
                break
            self._land(rnd, step)
            assert rnd.apply_step is not None
            if not final and step < rnd.apply_step:
                break
            self.landed[rnd.index] = step
            flat = self._apply(self.inflight.popleft(), flat)
            changed = True
        if final:  # end on one model: every fragment syncs once more, blocking
            for _ in range(
                self.cfg.fragments if self.cfg.fragments > 1 or not is_start(step, self.round_steps) else 1
            ):
                flat = self._apply(self._open(step, flat, blocking=True), flat)
            return flat
        if is_start(step, self.round_steps):
            rnd = self._open(step, flat, blocking=self.delay == 0)
            if self.delay == 0:
                flat = self._apply(rnd, flat)
                changed = True
            else:
                self.inflight.append(rnd)
        return flat if changed else None

    def _open(self, step: int, flat: Tensor, blocking: bool) -> _Round:
        assert self.anchor is not None
        r = self.opened
        f = fragment_of(r, self.cfg.fragments)
        sl = self.slices[f]
        snap = flat[sl].clone()
        fp = fingerprint(self.anchor[sl])
        if self.adaptive:
            fp = f"{fp}{TAG_SEP}{self.last_need}"
        self.opened += 1
        opened_at = time.monotonic()
        fut = self.node.pool.submit(self._exchange, r, f, self.anchor[sl] - snap, fp, step)
        wait = step if blocking else step + self.delay
        known = None if self.adaptive and not blocking else wait
        return _Round(r, f, snap, step, wait, known, blocking, fut, opened_at)

    def due(self, step: int) -> bool:
        """Whether an in-flight round waits or lands at ``step`` (beyond the fixed schedule)."""
        return any(step in (r.wait_step, r.apply_step) for r in self.inflight)

    def _land(self, rnd: _Round, step: int) -> None:
        """Take the round's result (waiting for it if it is not in yet); with an adaptive delay,
        measure how many steps this region's exchange took and decide when the round applies."""
        if rnd.result is not None:
            return
        t0 = time.monotonic()
        res: _Result = rnd.future.result()
        self.blocked_on_comm += time.monotonic() - t0
        rnd.result = res
        tags = {k: v.partition(TAG_SEP) for k, v in res.fingerprints.items()}
        res.fingerprints = {k: t[0] for k, t in tags.items()}
        if rnd.blocking or not self.adaptive:
            return
        if step > rnd.open_step:  # the steps ran from the opening to now, before any wait
            step_s = (t0 - rnd.opened_at) / (step - rnd.open_step)
            if step_s > 0:
                need = math.ceil(res.latency / step_s - 1e-9)
                self.last_need = int(min(max(1, need), max(1, self.round_steps - 1)))
        needs = {k: int(t[2]) for k, t in tags.items() if t[2].isdigit()}
        self.delay = adaptive_delay(self.delay, needs, self.round_steps)
        rnd.apply_step = rnd.open_step + self.delay

    def _exchange(self, r: int, f: int, delta: Tensor, fp: str, step: int) -> _Result:
        t0 = time.monotonic()
        res = self.reducers[f].reduce(r, delta, self.weight, fp, step, self.cfg.timeout_s)
        if res.stale:
            self.needs_catch_up = True  # the others have moved on without us
        latency = time.monotonic() - t0
        self.record_latency(latency)
        return _Result(res.avg, res.fingerprints, latency)

    def _apply(self, rnd: _Round, flat: Tensor) -> Tensor:
        assert self.anchor is not None
        self._land(rnd, rnd.open_step)
        res = rnd.result
        assert res is not None
        sl = self.slices[rnd.fragment]
        new_anchor, mom = outer_step(
            self.anchor[sl], res.avg, self.momentum[rnd.fragment], self.lr, self.mu, self.cfg.nesterov
        )
        if rnd.blocking:
            flat[sl] = new_anchor  # blocking: every region now holds exactly the same parameters
        elif self.cfg.overlap_merge == "mix":  # Streaming DiLoCo's merge of the late outer step
            a = self.cfg.overlap_mix
            flat[sl] = a * flat[sl] + (1 - a) * new_anchor
        else:  # overlapped: keep the local progress made since the snapshot on the new anchor
            flat[sl] = new_anchor + (flat[sl] - rnd.snapshot)
        with self.lock:
            self.anchor[sl] = new_anchor
            self.momentum[rnd.fragment] = mom
            self.completed += 1
            self._publish()
            self.lock.notify_all()
        root = min(res.fingerprints)
        if res.fingerprints[root] != res.fingerprints[self.me]:
            # Our anchor drifted from the others' (a round seen by some regions but not all):
            # take the lowest-named contributor's state, so all converge on one anchor.
            self.repair_from = root
            self.needs_catch_up = True
        return flat

    def _publish(self) -> None:
        assert self.anchor is not None
        self.public = {"anchor": self.anchor.clone()} | {
            f"momentum{i}": m.clone() for i, m in enumerate(self.momentum) if m is not None
        }
        self.public_round = self.completed

    def adopt(self, msg: InMessage, flat: Tensor) -> Tensor:
        """Take a peer's anchor and outer state; local progress since our own anchor is kept."""
        assert self.anchor is not None
        new_anchor = msg.tensors["anchor"]
        flat = flat + (new_anchor - self.anchor)
        with self.lock:
            self.anchor = new_anchor.clone()
            self.momentum = [msg.tensors.get(f"momentum{i}") for i in range(self.cfg.fragments)]
            for red in self.reducers:
                red.reset()
            self.inflight.clear()  # their results are relative to the old anchor
            self.opened = self.completed = msg.meta.round
            self._publish()
            self.lock.notify_all()
        return flat

    def finish(self) -> None:
        for rnd in self.inflight:
            rnd.future.cancel()

    # ------------------------------------------------------------ node side

    def handle_push(self, msg: InMessage) -> PushResult:
        if msg.meta.round < self.completed:
            return PushResult(False, "stale", self.opened)
        self.node.deliver(msg)
        return PushResult(True, "", self.opened)

    def export_state(self, min_round: int, timeout: float) -> OutMessage:
        self.wait_progress(min_round, timeout)
        with self.lock:
            public, rnd = self.public, self.public_round
        parts = [(k, self.encode_exact(v)) for k, v in public.items()]
        return OutMessage(self.meta(rnd), parts)

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": self.cfg.mode,
                "round": self.completed,
                "anchor": None if self.anchor is None else self.anchor.clone(),
                "momentum": [None if m is None else m.clone() for m in self.momentum],
                "reducers": [red.state_dict() for red in self.reducers],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state.get("mode") not in (None, self.cfg.mode):
            from contracts.errors import FailedPrecondition

            raise FailedPrecondition(
                f"checkpoint has sync state of mode {state['mode']!r}, config says {self.cfg.mode!r}",
                field="sync.mode",
            )
        self.anchor = (
            None if state.get("anchor") is None else torch.as_tensor(state["anchor"]).float().clone()
        )
        self.momentum = [None if m is None else torch.as_tensor(m).float() for m in state.get("momentum", [])]
        self.momentum += [None] * (self.cfg.fragments - len(self.momentum))
        for red, s in zip(self.reducers, state.get("reducers", []), strict=False):
            red.load_state_dict(s)
        self.opened = self.completed = int(state.get("round", 0))
