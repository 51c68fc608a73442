"""How much of a core a new one-thread worker would get on this host right now.

A short CPU-bound spin timed by the wall clock and by the thread's own CPU clock: on an idle core
they agree (1.0); with more runnable threads than cores the thread waits its turn and the wall
clock runs ahead (2.0: half a core). Unlike the load average, threads that sleep or wait on I/O do
not count, and the figure follows the host within seconds. The agent keeps a moving average and
reports it with every heartbeat; the planner prices CPU slots by it. It probes only while it runs
no workers of its own (a quote adds the new job's workers itself).
"""

from __future__ import annotations

import time

SPIN_S = 0.02  # CPU seconds per probe: 2 % of a core at one probe a second
MAX_WALL_S = 0.5  # a probe that cannot get its CPU time within this reports what it saw
SMOOTHING = 0.3  # weight of the newest probe in the moving average
QUIET_AFTER_S = 5.0  # no probe until this long after the node's own workers exited


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


class Contention:
    """The moving average of the probes (0.0 until the first)."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self.value = 0.0

    def add(self, sample: float) -> float:
        self.value = sample if self.value <= 0 else self.value + self.smoothing * (sample - self.value)
        return self.value
