"""One region's balanced round schedule: at which of its own steps each round ends.

The fixed plan has ``ceil(total_steps / size)`` rounds of ``size`` steps in every region (the last
one shorter if ``size`` does not divide ``total_steps``). Balanced, each round's steps per region
come from ``split_round`` over the figures carried in the messages of the round before it: the
wall time each region opened that round, which is when it began this one, and its seconds per
step over it. Those arrive with the round's result, a few steps into the round they split, so the
round is re-split while it runs; every region computes the same split from the same figures, and
each region gets at least ``least`` steps of it (more than a result takes to land), and a region
whose result is later still waits for it there (``resplits``), so none has passed its new end
when it learns it: every region runs the split every other computed, and the job's tokens stay
exact. Round r+2 is planned from round r's figures too (provisional: what the
runtime waits against and the step count estimated until round r+1's figures re-split it).
Rounds 0 and 1 start as the fixed plan's. Each round's total over the regions stays the fixed
plan's, so the job trains the same tokens; a region's own step count is whatever its speed earns
it.

The final round is split again as it runs (``mid_step``, ``on_mid_figures``): an overlapped
round absorbs the regions' drift (a region ahead opens the next round sooner), but the final one
ends in a blocking exchange, where every second a region's speed drifted over the round from
what its start figures said is a second the others wait. Halfway, each region sends its figures
over the round so far (where it is, when, and its pace); every region splits what is left of the
round from the same figures (a region that has gone ``least`` steps past its figures, or
reached its end, waits for the others' rather than end on a split they no longer hold). Then
again halfway through what is left (up to ``MAX_MID_SPLITS``
times, while the round's steps left over every region are at least twice ``least`` each),
so only the drift over the last stretch is left to wait for: on a shared host the regions' pace
moved by up to 15 % from one quarter of a round to the next, and a region split once, halfway,
still reached the final exchange 0.7-0.8 s before the last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from training.sync.algorithms.balance import MAX_STEP_S, split_round

# One region's figures from a round's messages: (wall time it opened the round, seconds per step).
Figures = dict[str, tuple[float, float]]
# One region's halfway figures of the final round: (wall time, steps into the round, seconds per step).
MidFigures = dict[str, tuple[float, int, float]]
MAX_MID_SPLITS = 3  # halfway, three quarters and seven eighths through the final round


@dataclass
class RoundPlan:
    me: str
    size: int  # steps per region per round in the fixed plan
    total_steps: int  # the fixed plan's steps per region
    base_round: int = 0  # the first round this plan holds ends for (a rejoiner's starts later)
    base_step: int = 0  # the local step the base round starts after
    ends: dict[int, int] = field(default_factory=dict)  # round -> the local step it ends at
    splits: dict[int, dict[str, int]] = field(default_factory=dict)  # round -> steps per region
    resplit: set[int] = field(default_factory=set)  # rounds re-split from their own start's figures
    midsplit: set[int] = field(default_factory=set)  # final rounds whose splits while running are over
    mid_count: dict[int, int] = field(default_factory=dict)  # final round -> splits while running so far
    mid_done: dict[int, dict[str, int]] = field(default_factory=dict)  # final round -> steps in, per region

    @property
    def mid_from(self) -> dict[int, int]:
        """Final round -> our steps into it at the last split's figures."""
        return {r: done[self.me] for r, done in self.mid_done.items() if self.me in done}

    def __post_init__(self) -> None:
        if self.size < 1 or self.total_steps < 1:
            raise ValueError(f"a round plan needs size >= 1 and total_steps >= 1, got {self}")
        if not self.ends:
            self._fill_fixed()

    @property
    def rounds(self) -> int:
        return -(-self.total_steps // self.size)

    def fixed_size(self, r: int) -> int:
        return max(0, min(self.size, self.total_steps - r * self.size))

    def _fill_fixed(self) -> None:
        """Until figures come in, rounds are the fixed plan's (two ahead: see the module doc)."""
        end = self.base_step
        for r in range(self.base_round, min(self.rounds, self.base_round + 2)):
            end += self.fixed_size(r)
            self.ends[r] = end

    def steps_of(self, r: int, region: str) -> int:
        split = self.splits.get(r)
        return split[region] if split and region in split else self.fixed_size(r)

    def end(self, r: int) -> int | None:
        """The local step round ``r`` ends at; a round its figures never planned (they were
        missing) is the fixed plan's size after the one before it. None beyond what is known."""
        if r not in self.ends and r - 1 in self.ends and r < self.rounds:
            self.ends[r] = self.ends[r - 1] + self.fixed_size(r)
        return self.ends.get(r)

    def start(self, r: int) -> int:
        return self.ends.get(r - 1, self.base_step)

    def is_final(self, r: int) -> bool:
        return r == self.rounds - 1

    def local_steps(self) -> int:
        """This region's step count: known once the last round is planned, else the known ends
        plus the fixed plan's rounds after them (an estimate that only ever grows to the truth)."""
        if not self.ends:  # rebased at or past the last round: nothing left to plan
            return self.base_step
        last = max(self.ends)
        return self.ends[last] + sum(self.fixed_size(r) for r in range(last + 1, self.rounds))

    def resplits(self, cur: int, least: int) -> bool:
        """Whether figures coming in during round ``cur`` re-split it (``on_figures``)."""
        return 2 * max(1, least) <= self.fixed_size(cur) and cur < self.rounds and cur not in self.resplit

    def on_figures(self, r: int, figures: Figures, now: int | None = None, least: int = 1) -> None:
        """Round ``r``'s figures are in: re-split round r+1, the round running, and plan round
        r+2 after it (module doc). ``now``: this region's step; ``least``: the fewest steps a
        region gets in round r+1, more than a round's result takes to land, so that no region
        has passed its new end when it learns it (no re-split where that is over half the
        round). One that has all the same (figures applied late, as after a catch-up) ends round
        r+1 where it is: its count then exceeds its share by the overrun, and its contribution
        is weighted by the tokens it trained."""
        if self.me not in figures or any(s <= 0 for _, s in figures.values()):
            return  # nothing to balance on: ``end`` gives the rounds the fixed size
        pace = {p: s for p, (_, s) in figures.items()}
        cur = r + 1
        floor = max(1, least)
        # A floor above half the round leaves too little to move: the provisional plan stands.
        if self.resplits(cur, floor) and cur in self.ends:
            # Round r+1 began in each region when it opened round r: the time its figures carry.
            total = self.fixed_size(cur) * len(figures)
            split = split_round({p: t for p, (t, _) in figures.items()}, pace, total, floor)
            self.splits[cur] = split
            self.resplit.add(cur)
            end = self.start(cur) + split[self.me]
            self.ends[cur] = end if now is None else max(end, now)
            self.ends.pop(cur + 1, None)  # follows round r+1's end: planned below or fixed
        nxt = r + 2
        if nxt >= self.rounds or nxt in self.ends or cur not in self.ends:
            return
        arrive = {p: t + self.steps_of(cur, p) * s for p, (t, s) in figures.items()}
        split = split_round(arrive, pace, self.fixed_size(nxt) * len(figures))
        self.splits[nxt] = split
        self.ends[nxt] = self.ends[cur] + split[self.me]

    def mid_step(self, r: int, least: int = 1) -> int | None:
        """The step at which this region sends its figures for round ``r``'s next split while it
        runs: halfway through what is left of its share, where ``r`` is the final round, re-split
        at its start (its split is every region's), and its splits are not over. Every region
        must have at least 4 steps left by the split; after the first split, the round's steps
        left over every region must be at least twice ``least`` each (so each keeps about
        ``least`` after sending halfway). Both are rules on the split and figures every region
        holds, so all of them send figures or none: a region waits for the others' (the
        strategy). None otherwise."""
        if not self.is_final(r) or r not in self.resplit or r in self.midsplit or r not in self.ends:
            return None
        k = self.mid_count.get(r, 0)
        split, done = self.splits[r], self.mid_done.get(r, {})
        left = [n - done.get(p, 0) for p, n in split.items()]
        if k >= MAX_MID_SPLITS or min(left) < 4:
            return None
        if k and sum(left) < 2 * max(1, least) * len(split):
            return None
        mine, share = self.mid_from.get(r, 0), self.ends[r] - self.start(r)
        return self.start(r) + mine + (share - mine) // 2

    def on_mid_figures(self, r: int, figures: MidFigures, now: int | None = None, least: int = 1) -> None:
        """The figures of round ``r``'s next split while it runs are in, one per region of its
        split: (wall time it was ``done`` steps into the round, ``done``, seconds per step since
        the figures before). What is left of the round's steps is split from them as
        ``split_round`` splits a round (the same figures give every region the same split), each
        region at least ``least`` more steps; one already past its new end ends where it is.
        Figures missing a region of the split, or unusable, leave the round as it is and end its
        splits (every region then keeps the split it holds)."""
        split = self.splits.get(r)
        if r in self.midsplit or split is None or r not in self.ends:
            return
        k = self.mid_count.get(r, 0) + 1
        self.mid_count[r] = k
        if k >= MAX_MID_SPLITS:
            self.midsplit.add(r)
        done_before = self.mid_from.get(r, 0)
        usable = set(figures) == set(split) and all(
            0 <= d <= split[p] and math.isfinite(t) and 0 < s <= MAX_STEP_S
            for p, (t, d, s) in figures.items()
        )
        left = sum(split[p] - d for p, (_, d, _) in figures.items()) if usable else 0
        floor = max(1, least)
        if not usable or figures[self.me][1] < done_before or left < floor * len(figures):
            self.midsplit.add(r)  # every region holds the same figures: all of them stop here
            return
        at = {p: t for p, (t, _, _) in figures.items()}
        rest = split_round(at, {p: s for p, (_, _, s) in figures.items()}, left, floor)
        self.splits[r] = {p: figures[p][1] + rest[p] for p in figures}
        self.mid_done[r] = {p: d for p, (_, d, _) in figures.items()}
        end = self.start(r) + self.splits[r][self.me]
        self.ends[r] = end if now is None else max(end, now)

    def job_step(self, step: int) -> float:
        """Where ``step`` (completed local steps) is on the fixed plan's step axis: the schedule
        (learning rate) follows the job's progress, not this region's step count."""
        for r in sorted(self.ends):
            lo, hi = self.start(r), self.ends[r]
            if step <= hi:
                frac = (step - lo) / max(1, hi - lo)
                return r * self.size + max(0.0, frac) * self.fixed_size(r)
        return float(self.total_steps)

    def rebase(self, r: int, step: int) -> None:
        """A region that took a peer's state at round ``r`` starts it after local ``step``."""
        self.base_round, self.base_step = r, step
        self.ends, self.splits, self.resplit, self.midsplit = {}, {}, set(), set()
        self.mid_count, self.mid_done = {}, {}
        self._fill_fixed()

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_round": self.base_round,
            "base_step": self.base_step,
            "ends": {str(k): v for k, v in self.ends.items()},
            "splits": {str(k): dict(v) for k, v in self.splits.items()},
            "resplit": sorted(self.resplit),
            "midsplit": sorted(self.midsplit),
            "mid_count": {str(k): v for k, v in self.mid_count.items()},
            "mid_done": {str(k): dict(v) for k, v in self.mid_done.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("ends"):
            return
        self.base_round, self.base_step = int(state["base_round"]), int(state["base_step"])
        self.ends = {int(k): int(v) for k, v in state["ends"].items()}
        self.splits = {int(k): {p: int(n) for p, n in v.items()} for k, v in state["splits"].items()}
        self.resplit = {int(k) for k in state.get("resplit", [])}
        self.midsplit = {int(k) for k in state.get("midsplit", [])}
        self.mid_count = {int(k): int(v) for k, v in state.get("mid_count", {}).items()}
        self.mid_done = {
            int(k): {p: int(n) for p, n in v.items()} for k, v in state.get("mid_done", {}).items()
        }
        # A state saved before the regions' own counts were kept: no further split of a round
        # already split while running (every region resuming from such a state stops alike).
        self.midsplit |= {r for r, k in self.mid_count.items() if k and r not in self.mid_done}
