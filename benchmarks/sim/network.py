"""The event queue and the flow network the simulator runs on.

Time advances from event to event. An event is either a timer (a compute op ending, a message's
propagation delay elapsing) or a flow draining its last byte. A flow crosses a path of resources
(a device's port, a link between regions), each with a capacity in bytes/s; the rates of the flows
in progress are the max-min fair allocation over those capacities, found by progressive filling
(Bertsekas & Gallager, "Data Networks", 2nd ed., §6.5.2): raise every unfrozen flow's rate
equally until some resource is full, freeze the flows through it, repeat. Rates are recomputed
whenever a flow starts or ends, so a transfer slows down while others share its link and speeds up
when they finish. A message is delivered one latency after its last byte leaves.

Everything is deterministic: ties are broken by insertion order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

Resource = Hashable
Callback = Callable[[], None]


@dataclass(eq=False)
class Flow:
    path: tuple[Resource, ...]
    remaining: float
    latency: float
    on_done: Callback
    rate: float = 0.0


@dataclass
class Network:
    """Capacities in bytes/s per resource; ``label_of`` maps a resource to the link it belongs to."""

    capacity: dict[Resource, float]
    now: float = 0.0
    bytes_on: dict[str, float] = field(default_factory=dict)
    _timers: list[tuple[float, int, Callback]] = field(default_factory=list)
    _flows: list[Flow] = field(default_factory=list)
    _seq: int = 0
    _dirty: bool = False

    def at(self, delay: float, fn: Callback) -> None:
        """Run ``fn`` ``delay`` seconds from now."""
        self._seq += 1
        heapq.heappush(self._timers, (self.now + max(0.0, delay), self._seq, fn))

    def send(
        self,
        path: Sequence[Resource],
        nbytes: float,
        latency: float,
        on_done: Callback,
        label: str | None = None,
    ) -> None:
        """Move ``nbytes`` over ``path``; ``on_done`` runs when the last byte has arrived."""
        if label is not None:
            self.bytes_on[label] = self.bytes_on.get(label, 0.0) + nbytes
        if nbytes <= 0 or not path:
            self.at(latency, on_done)
            return
        self._flows.append(Flow(tuple(path), float(nbytes), latency, on_done))
        self._dirty = True

    def _allocate(self) -> None:
        """Max-min fair rates by progressive filling."""
        left = {}
        users: dict[Resource, list[Flow]] = {}
        for f in self._flows:
            f.rate = -1.0
            for r in f.path:
                users.setdefault(r, []).append(f)
                left[r] = self.capacity[r]
        active = {r: len(fs) for r, fs in users.items()}
        unfrozen = len(self._flows)
        while unfrozen:
            # The resource that fills first at an equal share of what is left on it.
            bottleneck, share = None, math.inf
            for r, n in active.items():
                if n and left[r] / n < share:
                    bottleneck, share = r, left[r] / n
            assert bottleneck is not None
            for f in users[bottleneck]:
                if f.rate >= 0:
                    continue
                f.rate = share
                unfrozen -= 1
                for r in f.path:
                    left[r] -= share
                    active[r] -= 1
        self._dirty = False

    def run(self) -> float:
        """Run until nothing is left to happen; returns the time of the last event."""
        while self._timers or self._flows:
            if self._dirty:
                self._allocate()
            t_flow, first = math.inf, None
            for f in self._flows:
                t = self.now + f.remaining / f.rate
                if t < t_flow:
                    t_flow, first = t, f
            if self._timers and self._timers[0][0] <= t_flow:
                t, _, fn = heapq.heappop(self._timers)
                self._advance(t)
                fn()
                continue
            self._advance(t_flow)
            assert first is not None
            first.remaining = 0.0
            done = [f for f in self._flows if f.remaining <= 1e-9 * max(1.0, f.rate)]
            self._flows = [f for f in self._flows if f.remaining > 1e-9 * max(1.0, f.rate)]
            self._dirty = True
            for f in done:
                self.at(f.latency, f.on_done)
        return self.now

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self._flows:
                f.remaining -= f.rate * dt
            self.now = t
