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
    remaining: float  # bytes left at time ``since``
    latency: float
    on_done: Callback
    rate: float = 0.0
    since: float = 0.0
    version: int = 0  # bumped whenever the rate changes; older heap entries are stale


@dataclass
class Network:
    """Capacities in bytes/s per resource; ``bytes_on`` counts the bytes sent under each label.

    Rates are recomputed only for the flows that share a resource, directly or through other flows,
    with one that started or ended: flows on disjoint paths do not affect each other's max-min rates.
    """

    capacity: dict[Resource, float]
    now: float = 0.0
    bytes_on: dict[str, float] = field(default_factory=dict)
    _timers: list[tuple[float, int, Callback]] = field(default_factory=list)
    _ends: list[tuple[float, int, int, Flow]] = field(default_factory=list)
    _users: dict[Resource, dict[Flow, None]] = field(default_factory=dict)
    _dirty: list[Resource] = field(default_factory=list)
    _seq: int = 0

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
        flow = Flow(tuple(path), float(nbytes), latency, on_done, since=self.now)
        for r in flow.path:
            self._users.setdefault(r, {})[flow] = None
        self._dirty += flow.path

    def _component(self) -> list[Flow]:
        """Flows reachable from the dirty resources through shared resources, in a stable order."""
        seen_r: set[Resource] = set()
        flows: dict[Flow, None] = {}
        stack = list(self._dirty)
        self._dirty.clear()
        while stack:
            r = stack.pop()
            if r in seen_r:
                continue
            seen_r.add(r)
            for f in self._users.get(r, ()):
                if f not in flows:
                    flows[f] = None
                    stack.extend(f.path)
        return list(flows)

    def _allocate(self) -> None:
        """Max-min fair rates by progressive filling, over the flows a change can affect."""
        flows = self._component()
        left: dict[Resource, float] = {}
        active: dict[Resource, int] = {}
        for f in flows:
            f.remaining -= f.rate * (self.now - f.since)
            f.since = self.now
            f.rate = -1.0
            for r in f.path:
                left[r] = self.capacity[r]
                active[r] = active.get(r, 0) + 1
        unfrozen = len(flows)
        while unfrozen:
            # The resource that fills first at an equal share of what is left on it.
            bottleneck, share = None, math.inf
            for r, n in active.items():
                if n and left[r] / n < share:
                    bottleneck, share = r, left[r] / n
            assert bottleneck is not None
            for f in self._users[bottleneck]:
                if f.rate >= 0:
                    continue
                f.rate = share
                f.version += 1
                unfrozen -= 1
                for r in f.path:
                    left[r] -= share
                    active[r] -= 1
                self._seq += 1
                heapq.heappush(
                    self._ends, (self.now + max(0.0, f.remaining) / share, self._seq, f.version, f)
                )

    def run(self) -> float:
        """Run until nothing is left to happen; returns the time of the last event."""
        while True:
            if self._dirty:
                self._allocate()
            while self._ends and self._ends[0][2] != self._ends[0][3].version:
                heapq.heappop(self._ends)
            if self._timers and (not self._ends or self._timers[0][0] <= self._ends[0][0]):
                t, _, fn = heapq.heappop(self._timers)
                self.now = max(self.now, t)
                fn()
            elif self._ends:
                t, _, _, f = heapq.heappop(self._ends)
                self.now = max(self.now, t)
                f.version += 1  # finished: no later entry may fire
                for r in f.path:
                    del self._users[r][f]
                self._dirty += f.path
                self.at(f.latency, f.on_done)
            else:
                return self.now
