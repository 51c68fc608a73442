"""``local_sgd`` and ``diloco``: every region keeps the same anchor; each round the regions
average their pseudo-gradients (anchor - local params, compressed with error feedback; a ring with
3+ regions, ``training.sync.collective``) and an outer optimizer moves the anchor.

``local_sgd`` averages every H steps, ``diloco`` every H steps with outer Nesterov SGD. A blocking
round assigns the new anchor to the parameters, so the regions hold bit-identical replicas after
it. With ``overlap`` a round's exchange runs in the background and is applied ``delay`` steps
later, keeping the local progress made meanwhile (params = new anchor + progress since the
snapshot). With the ``progress`` merge the region trains on meanwhile from the outer step its own
pseudo-gradient gives (``eager_start``), and the progress is counted from there. With
``on_arrival`` a region never waits at the delay: it applies the round at the first step on or
after it at which the result has arrived, and waits only where the next round opens (its
pseudo-gradient needs the new anchor) or, with the ``progress`` merge, where the round would land
later than a tenth of its round or its delay, whichever is later
(``contracts.sync_delay.progress_lag_steps``). The regions may then apply a round at different
steps; the anchors stay equal (the outer step depends on the round's result alone), only how much
local progress is mixed in differs. With ``fragments`` the parameters are split and each fragment
syncs on its own staggered schedule (Streaming DiLoCo). The last step always ends with a blocking
round.

With a ``plan`` (work balancing, ``training.sync.algorithms.round_plan``) rounds end where the
plan says instead of every H steps: each region's steps per round follow its measured speed, its
contribution is weighted by the tokens it trained in the round, and every round's messages carry
the figures the next splits are computed from; halfway through the final round each region sends
its figures over the round so far on the ``balance`` stream, and every region splits the rest of
the round from them (``RoundPlan.on_mid_figures``); then again halfway through what is left, on
``balance1``, ``balance2``, with the pace since the figures before.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from contracts.sync_delay import progress_lag_steps
from training.sync.algorithms.balance import MAX_STEP_S
from training.sync.algorithms.outer import eager_start, merge_late, outer_step
from training.sync.algorithms.round_plan import RoundPlan
from training.sync.algorithms.schedule import fragment_of, fragment_slices, is_start
from training.sync.collective import DenseReducer
from training.sync.messages import InMessage, Meta, OutMessage, PushResult
from training.sync.strategies.base import Strategy, fingerprint


@dataclass
class _Result:
    avg: Tensor
    fingerprints: dict[str, str]
    latency: float
    anchor: Tensor  # the fragment's new anchor and outer momentum (the outer step, done in the exchange)
    momentum: Tensor | None
    figures: dict[str, tuple[float, float]]  # balancing figures per contributing region


@dataclass
class _Round:
    index: int
    fragment: int
    snapshot: Tensor
    open_step: int
    apply_from: int  # not applied before this step (the delay)
    wait_step: int  # by this step the result must be in (a region without it waits for it)
    blocking: bool  # applied at once: the new anchor is assigned
    future: Any
    result: _Result | None = None
    eager: bool = False  # the region trains on from its own outer step (``snapshot``: that start)


class AnchoredSync(Strategy):
    stream = "anchored"
    admits_late = True  # a peer that joins mid-round is included from the next round

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        c = self.cfg
        self.lr, self.mu = c.effective_outer_lr, c.effective_outer_momentum
        self.round_steps, self.delay = c.round_steps, c.delay_steps
        self.on_arrival = False  # set by the engine where every rank of the region can follow it
        self.last_lag = 0  # steps from the opening to the applying of the last overlapped round
        self.landed: dict[int, int] = {}  # round -> step it was applied at
        # (step, lag, waited) of rounds applied since last taken; waited: its result was not in yet
        self.landings: list[tuple[int, int, bool]] = []
        self.anchor: Tensor | None = None
        self.slices: list[slice] = []
        self.momentum: list[Tensor | None] = [None] * c.fragments
        self.reducers = [
            DenseReducer(
                self.node,
                f"anchored{f}",
                self.codec,
                c.chunk_bytes,
                c.error_feedback,
                c.ring_order,
                list(c.hierarchy.values()),
            )
            for f in range(c.fragments)
        ]
        self.opened = self.completed = 0
        self.inflight: deque[_Round] = deque()
        self.public_round = 0
        self.public_step = 0  # the step the public state is as of (its next round opens after it)
        self.plan: RoundPlan | None = None  # work balancing: set by the engine where it applies
        self._now: tuple[int, float, float, float] | None = None  # (step, monotonic, wall, waits)
        self._mark: tuple[int, float, float] | None = None  # (step, monotonic, waits) at the last open
        self.splits: list[dict[str, int]] = []  # balanced splits planned since last taken (metrics)
        # (final round, split) whose figures we sent, what they said, and (step, monotonic, waits) then.
        self.mid_sent: tuple[int, int] | None = None
        self._mine: tuple[float, int, float] = (0.0, 0, 0.0)
        self._mid_mark: tuple[int, float, float] | None = None

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

    def tick(self, step: int, mono: float, wall: float, waits: float) -> None:
        """The engine, at each event before ``on_event``: when the step ended (monotonic and wall
        clock) and the seconds this region has spent in sync calls so far."""
        self._now = (step, mono, wall, waits)
        if self.plan is not None:
            self.step = step  # a catch-up before ``on_event`` rebases the plan at this step
        if self._mark is None:
            self._mark = (step, mono, waits)

    def opens_at(self, step: int) -> bool:
        """Whether a round opens (ends this region's part of it) at ``step``."""
        if self.plan is None:
            return is_start(step, self.round_steps) or step == self.total_steps
        return self.plan.end(self.opened) == step

    def _is_final(self, step: int) -> bool:
        if self.plan is None:
            return step == self.total_steps
        return self.plan.is_final(self.opened) and self.plan.end(self.opened) == step

    def _figures(self, step: int) -> tuple[float, float]:
        """(wall time this round opened, seconds per step since the last opening without sync
        waits); (0, 0) where there is nothing measured yet, or where this region does not balance
        (its peers then split evenly: every region must run the split the others planned)."""
        if self.plan is None or self._now is None or self._mark is None or step <= self._mark[0]:
            return 0.0, 0.0
        s0, m0, w0 = self._mark
        _, m1, wall, w1 = self._now
        self._mark = (step, m1, w1)
        return wall, min(MAX_STEP_S, max(0.0, m1 - m0 - (w1 - w0)) / (step - s0))

    @property
    def _least(self) -> int:
        """Steps a region keeps after a split's figures go out: more than they take to land."""
        return 2 * self.delay + 1

    @staticmethod
    def _balance_stream(k: int) -> str:
        return "balance" if k == 0 else f"balance{k}"

    def balancing(self, step: int) -> bool:
        """Whether ``step`` sends the final round's figures for its next split, or can split it
        from the peers' (all in): an event for the engine, off the fixed schedule."""
        plan, r = self.plan, self.opened
        if plan is None or r in plan.midsplit:
            return False
        k = plan.mid_count.get(r, 0)
        if self.mid_sent != (r, k):
            at = plan.mid_step(r, self._least)
            return at is not None and at <= step
        if self._must_split(step):
            return True
        stream = self._balance_stream(k)
        return self.node.take_if_complete(stream, r, self.node.participants(r), take=False) is not None

    def _must_split(self, step: int) -> bool:
        """Whether ``step`` may go no further without the split whose figures we sent: any split
        leaves this region at least ``least`` steps past them, and its current end ends the run
        (a region ending there while the others split would run a different round)."""
        plan, r = self.plan, self.opened
        assert plan is not None
        sent_at = plan.start(r) + self._mine[1]
        return step >= sent_at + self._least or step == plan.end(r)

    def _mid_split(self, step: int) -> None:
        plan, r = self.plan, self.opened
        if plan is None or r in plan.midsplit:
            return
        k = plan.mid_count.get(r, 0)
        stream = self._balance_stream(k)
        at = plan.mid_step(r, self._least) if self.mid_sent != (r, k) else None
        if at is not None and at <= step and self._now and self._mark:
            # At its step or, where the split that set it came later, at once: every region
            # sends (its peers wait for its figures). The pace since the figures before: the
            # round's opening, then the last split's.
            s0, m0, w0 = self._mark if k == 0 or self._mid_mark is None else self._mid_mark
            _, m1, wall, w1 = self._now
            pace = min(MAX_STEP_S, max(0.0, m1 - m0 - (w1 - w0)) / max(1, step - s0))
            meta = Meta(self.me, stream, r, step=step - plan.start(r), step_s=pace, opened_at=wall)
            for p in self.node.participants(r):
                self.node.pool.submit(self.node.client(p).push, OutMessage(meta), self.cfg.timeout_s)
            self.mid_sent = (r, k)
            self._mine = (wall, step - plan.start(r), pace)
            self._mid_mark = (step, m1, w1)
        if self.mid_sent == (r, k):
            peers = self.node.participants(r)
            got = self.node.take_if_complete(stream, r, peers)
            if got is None and self._must_split(step):
                t0 = time.monotonic()
                # A live peer silent past the timeout ends the splits here (figures missing: every
                # region keeps the split it holds), not the peer's part in the job.
                got = self.node.collect(stream, r, peers, t0 + self.cfg.timeout_s, mark_missing=False)
                self.blocked_on_comm += time.monotonic() - t0
            if got is None:
                return
            figures = {p: (m.meta.opened_at, m.meta.step, m.meta.step_s) for p, m in got.items()}
            before = plan.splits.get(r)
            plan.on_mid_figures(r, figures | {self.me: self._mine}, now=step, least=self._least)
            if plan.splits.get(r) != before:
                self.splits.append(plan.splits[r])

    def on_event(self, step: int, flat: Tensor) -> Tensor | None:
        self.step = step
        plan = self.plan
        if plan is not None and (plan.end(self.opened) or 0) < step and step > 1:
            plan.rebase(self.opened, step)  # resumed past what the saved plan knows: start afresh
        self._mid_split(step)
        changed = False
        # Whether this step ends the run is asked again after each landing: a balanced round's
        # result re-splits the round running, which may move its end past this step.
        while self.inflight and (self._is_final(step) or self._lands(self.inflight[0], step)):
            rnd = self.inflight.popleft()
            self.landed[rnd.index] = step
            self.last_lag = step - rnd.open_step
            self.landings.append((step, self.last_lag, not rnd.future.done()))
            # A round applied where the next one opens leaves a state as of the step before: a
            # peer that catches up from it then opens that next round at this step, as we do,
            # not a whole round later (its rounds would lag ours by one to the end of the run).
            # A balanced region's rounds follow no fixed step: a peer taking its state rebases
            # its plan instead.
            opening = self._is_final(step) or (plan is None and is_start(step, self.round_steps))
            flat = self._apply(rnd, flat, step - 1 if opening else step)
            changed = True
        if changed:
            self._mid_split(step)  # a split learnt just now may make this step its figures' step
        if self._is_final(step):  # end on one model: every fragment syncs once more, blocking
            for _ in range(self.cfg.fragments):
                flat = self._apply(self._open(step, flat, blocking=True), flat)
            return flat
        if self.opens_at(step):
            rnd = self._open(step, flat, blocking=self.delay == 0)
            if self.delay == 0:
                flat = self._apply(rnd, flat)
                changed = True
            else:
                self.inflight.append(rnd)
                changed = changed or rnd.eager
        return flat if changed else None

    def _open(self, step: int, flat: Tensor, blocking: bool) -> _Round:
        assert self.anchor is not None
        r = self.opened
        f = fragment_of(r, self.cfg.fragments)
        sl = self.slices[f]
        snap = flat[sl].clone()
        weight, figures = self.weight, self._figures(step)
        plan = self.plan
        if plan is not None and plan.end(r) == step:
            # Tokens, not regions: a region that trained more steps this round counts for more.
            weight *= (step - plan.start(r)) / max(1, plan.fixed_size(r))
            plan.end(r + 1)  # planned from round r-1's figures when they came, else fixed
        self.opened += 1
        # The anchor and momentum stay as they are until this round is applied (the round before
        # has been, and a catch-up replaces them rather than writing into them), so the
        # fingerprint, the pseudo-gradient and the outer step run in the exchange's thread, off
        # the training thread.
        fut = self.node.pool.submit(
            self._exchange, r, f, self.anchor, self.momentum[f], snap, step, weight, figures
        )
        apply_from = step if blocking else step + self.delay
        merge = self.cfg.overlap_merge or "progress"
        # On arrival, a late result is waited for only where the next round opens; where its
        # figures will re-split the running round, no later than the fewest steps a re-split
        # leaves a region (a region past its new end would overrun its share of the job's tokens);
        # where it keeps the local progress, no later than the lag that merge was chosen and
        # calibrated for (the progress it keeps grows staler with every step: at H=20 one run in five
        # of a workload lost 0.9 % held-out loss while rounds could land up to a round late, the
        # others 0.2-0.3 %).
        nxt = step + self.round_steps if plan is None else plan.end(r + 1) or step + self.round_steps
        if plan is not None and plan.resplits(r + 1, self._least):
            nxt = min(nxt, step + self._least)
        if merge == "progress":
            nxt = min(nxt, step + max(self.delay, progress_lag_steps(self.round_steps)))
        wait = nxt if self.on_arrival and not blocking else apply_from
        if not blocking:
            a, mom = self.anchor[sl], self.momentum[f]
            start = eager_start(a, snap, mom, self.lr, self.mu, self.cfg.nesterov, merge)
            if start is not None:  # train on from the outer step our own pseudo-gradient gives
                flat[sl] = start
                return _Round(r, f, start, step, apply_from, wait, blocking, fut, eager=True)
        return _Round(r, f, snap, step, apply_from, wait, blocking, fut)

    def _lands(self, rnd: _Round, step: int) -> bool:
        """Whether ``rnd`` is applied at ``step``: at its delay on the fixed schedule; on arrival,
        from its delay on once its result is in, and at the latest where the next round opens."""
        return step >= rnd.wait_step or (step >= rnd.apply_from and rnd.future.done())

    def due(self, step: int) -> bool:
        """Whether an in-flight round lands at ``step`` (beyond the fixed schedule)."""
        return bool(self.inflight) and self._lands(self.inflight[0], step)

    def _land(self, rnd: _Round) -> None:
        """Take the round's result, waiting for it if it is not in yet."""
        if rnd.result is not None:
            return
        t0 = time.monotonic()
        rnd.result = rnd.future.result()
        self.blocked_on_comm += time.monotonic() - t0

    def _exchange(
        self,
        r: int,
        f: int,
        anchor: Tensor,
        momentum: Tensor | None,
        snap: Tensor,
        step: int,
        weight: float,
        figures: tuple[float, float],
    ) -> _Result:
        t0 = time.monotonic()
        a = anchor[self.slices[f]]
        res = self.reducers[f].reduce(
            r, a - snap, weight, fingerprint(a), step, self.cfg.timeout_s, figures=figures
        )
        if res.stale:
            self.needs_catch_up = True  # the others have moved on without us
        latency = time.monotonic() - t0
        self.record_latency(latency)
        new_anchor, mom = outer_step(a, res.avg, momentum, self.lr, self.mu, self.cfg.nesterov)
        return _Result(res.avg, res.fingerprints, latency, new_anchor, mom, res.figures)

    def _apply(self, rnd: _Round, flat: Tensor, as_of: int | None = None) -> Tensor:
        """``as_of``: the step the resulting state is as of (default: this event's)."""
        assert self.anchor is not None
        self._land(rnd)
        res = rnd.result
        assert res is not None
        sl = self.slices[rnd.fragment]
        new_anchor, mom = res.anchor, res.momentum
        if rnd.blocking:
            flat[sl] = new_anchor  # blocking: every region now holds exactly the same parameters
        else:  # overlapped: Streaming DiLoCo's mix, or the local progress kept on the new anchor
            merge = self.cfg.overlap_merge or "progress"
            flat[sl] = merge_late(flat[sl], new_anchor, rnd.snapshot, merge, self.cfg.overlap_mix)
        with self.lock:
            self.anchor[sl] = new_anchor
            self.momentum[rnd.fragment] = mom
            self.completed += 1
            self._publish(self.step if as_of is None else as_of)
            self.lock.notify_all()
        if self.plan is not None:
            # Re-splits the running round: each region gets at least twice the steps a result
            # is planned to take to land (``delay``), so a region up to twice as fast as the one
            # the delay was fitted to has not passed its new end when the result lands.
            self.plan.on_figures(rnd.index, res.figures, now=self.step, least=2 * self.delay + 1)
            if rnd.index + 1 in self.plan.splits:
                self.splits.append(self.plan.splits[rnd.index + 1])
        root = min(res.fingerprints)
        if res.fingerprints[root] != res.fingerprints[self.me]:
            # Our anchor drifted from the others' (a round seen by some regions but not all):
            # take the lowest-named contributor's state, so all converge on one anchor.
            self.repair_from = root
            self.needs_catch_up = True
        return flat

    def _publish(self, as_of: int | None = None) -> None:
        """Under the lock: what a peer's pull gets is the anchor and momentum as of this round
        (``export_state`` encodes them under the same lock, so no copy is kept here), and the
        step they are as of (default: this event's)."""
        self.public_round = self.completed
        self.public_step = self.step if as_of is None else as_of

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
            self._publish(msg.meta.step)
            self.lock.notify_all()
        if self.plan is not None:  # our rounds restart from theirs: fixed sizes until figures come
            self.plan.rebase(self.opened, self.step)
            self._mark = None
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
            assert self.anchor is not None
            public = {"anchor": self.anchor} | {
                f"momentum{i}": m for i, m in enumerate(self.momentum) if m is not None
            }
            parts = [(k, self.encode_exact(v)) for k, v in public.items()]
            rnd, step = self.public_round, self.public_step
        return OutMessage(Meta(sender=self.me, stream=self.stream, round=rnd, step=step), parts)

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": self.cfg.mode,
                "round": self.completed,
                "anchor": None if self.anchor is None else self.anchor.clone(),
                "momentum": [None if m is None else m.clone() for m in self.momentum],
                "reducers": [red.state_dict() for red in self.reducers],
                "plan": None if self.plan is None else self.plan.state_dict(),
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
        if self.plan is not None and state.get("plan"):
            self.plan.load_state_dict(state["plan"])
