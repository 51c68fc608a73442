"""How much of a core a new one-thread worker would get on this host, over a recent window.

A short CPU-bound spin timed by the wall clock and by the thread's own CPU clock: on an idle core
they agree (1.0); with more runnable threads than cores the thread waits its turn and the wall
clock runs ahead (2.0: half a core). Unlike the load average, threads that sleep or wait on I/O do
not count. One 20 ms spin is noisy on a busy host (probes half a second apart read 1.1 and 4.6), so the
agent reports the interquartile mean of the probes of the last ``WINDOW_S``: load that stays
shows in every probe, a burst shorter than a quarter of the window is trimmed away. The planner
prices CPU slots by it.

The agent's own work is kept out: it probes only while it runs no workers of its own (a quote adds
the new job's workers itself), and after measuring its reference step it probes for ``SETTLE_S``
before it registers, so the figure it registers with is the host after its own start-up, not
during it. Where several agents share a host, the last to register has seen none of the others'
measurements, and the planner takes the host's quietest figure.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

SPIN_S = 0.02  # CPU seconds per probe: 2 % of a core at one probe a second
MAX_WALL_S = 0.5  # a probe that cannot get its CPU time within this reports what it saw
WINDOW_S = 20.0  # the figure covers the probes of this many seconds before the newest
QUIET_AFTER_S = 5.0  # no probe until this long after the node's own workers exited
SETTLE_S = 3.0  # probing after the reference step, before registering
SETTLE_EVERY_S = 0.2  # 15 probes in the settle window: 10 % of a core for 3 s


def probe(spin_s: float = SPIN_S, max_wall_s: float = MAX_WALL_S) -> float:
    """Wall over CPU time of a short spin on this thread (>= 1)."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    x = 0
    while True:
        for _ in range(2000):
            x += 1
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        if cpu >= spin_s or wall >= max_wall_s:
            break
    return max(1.0, wall / cpu) if cpu > 0 else max_wall_s / spin_s


def interquartile_mean(samples: Sequence[float]) -> float:
    """Mean of the middle half of ``samples`` (sorted; a quarter cut from each end, at least the
    median kept); 0.0 for none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    n = len(ordered)
    cut = n // 4
    middle = ordered[cut : n - cut]
    return sum(middle) / len(middle)


class Contention:
    """The probes of the last ``window_s`` (by the newest probe's time) and their figure."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._probes: deque[tuple[float, float]] = deque()  # (monotonic seconds, sample)

    def add(self, sample: float, at: float | None = None) -> float:
        at = time.monotonic() if at is None else at
        self._probes.append((at, sample))
        while self._probes and self._probes[0][0] < at - self.window_s:
            self._probes.popleft()
        return self.value

    @property
    def value(self) -> float:
        """The window's interquartile mean (0.0 until the first probe: the heartbeat says 0).
        It keeps its last figure while the agent does not probe (its own workers run)."""
        return interquartile_mean([s for _, s in self._probes])


def settle(
    into: Contention,
    duration_s: float = SETTLE_S,
    every_s: float = SETTLE_EVERY_S,
    measure: Callable[[], float] = probe,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Probe every ``every_s`` for ``duration_s`` into ``into`` (blocking); its figure after."""
    count = round(duration_s / every_s) + 1  # a probe at each end of the window
    for i in range(count):
        into.add(measure(), clock())
        if i + 1 < count:
            sleep(every_s)
    return into.value
