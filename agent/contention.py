"""How busy this host's cores are for a new one-thread worker, over a recent window.

The figure is runnable threads per core, a new one included: (o + 1) / cores for o other
runnable threads, cpn's own left out (``agent.cpn_threads``: a quote adds the slots of cpn's jobs
itself). Unlike the load average, threads that sleep or wait on I/O do not count. Where this
process may run on every CPU of the machine, the kernel's count of runnable threads
(``procs_running``, this one included) says how many there are: on an idle 2-core host the figure
is 0.5, and the planner counts no other thread there. Elsewhere (a share of a larger machine,
where that machine-wide count says nothing of its own CPUs) a short CPU-bound spin is timed by the
wall clock and by the thread's own CPU clock: on an idle core they agree; with more runnable
threads than cores the thread waits its turn and the wall clock runs ahead (2.0: half a core); a
spin that did not wait reads 1.0. The count comes first because the spin measures the share the
scheduler gives the probe, not a share per thread where the kernel's autogroup shares the cores
per session: beside two busy loops and other agents' jobs, the spin's figure with cpn's threads
taken out priced the loops as none (docs/cost-model.md, "Host share σ").

One probe is noisy on a busy host (spins half a second apart read 1.1 and 4.6), so the
agent reports the interquartile mean of the probes of the last ``WINDOW_S``: load that stays
shows in every probe, a burst shorter than a quarter of the window is trimmed away. The planner
prices CPU slots by it.

The agent's own work is kept out: it probes only while it runs no workers of its own (a quote adds
the new job's workers itself), and after measuring its reference step it probes for ``SETTLE_S``,
still in its turn of the host (``profile.measure_profile``), so the figure it sends with its
profile (``ProfileReport``: the node is registered, "measuring", by then) is the host after its
own start-up, not during it nor during the next co-located agent's reference step. Where several
agents share a host, the last to measure has seen none of the others' measurements, and the
planner takes the host's quietest figure.
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence

from agent.cpn_threads import CpnThreads
from agent.profile import physical_cores
from contracts.registration import MAX_CONTENTION_PROBES, MAX_PROBE_AGE_S

SPIN_S = 0.02  # CPU seconds per probe: 2 % of a core at one probe a second
MAX_WALL_S = 0.5  # a probe that cannot get its CPU time within this reports what it saw
WINDOW_S = 20.0  # the figure covers the probes of this many seconds before the newest
QUIET_AFTER_S = 5.0  # no probe until this long after the node's own workers exited
SETTLE_S = 3.0  # probing after the reference step, before the profile goes up
SETTLE_EVERY_S = 0.2  # 15 probes in the settle window: 10 % of a core for 3 s
# A spin whose wall clock ran at most this much ahead of its CPU clock did not wait its turn (a
# timer tick or a short kernel thread costs a few per cent on an idle core).
WAITED = 1.05
CPN_THREADS = CpnThreads()  # cpn's own processes on this machine, kept out of the figure


def runnable_threads() -> int | None:
    """The kernel's count of runnable threads on the machine, the caller included; None where
    unreadable."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


@functools.cache
def whole_machine_cores() -> int:
    """This process's CPUs where it may run on every CPU of the machine, else 0 (a share of a
    larger machine: the machine-wide runnable count says nothing about its own CPUs)."""
    cores = physical_cores()
    return cores if cores == (os.cpu_count() or 0) else 0


def probe(
    spin_s: float = SPIN_S,
    max_wall_s: float = MAX_WALL_S,
    cores: int | None = None,
    count: Callable[[], int | None] = runnable_threads,
    own: Callable[[], int | None] | None = None,
) -> float:
    """Runnable threads per core, this one included and cpn's own left out: the machine's runnable
    count over its ``cores`` (None: look them up; 0: not the whole machine), else, where that is
    not known, a short spin on this thread, wall over CPU time where it waited its turn
    (> ``WAITED``) and 1.0 where it did not; less ``own()`` runnable threads of cpn's processes
    (``agent.cpn_threads``; default: this machine's, None: not known, nothing taken out) per
    core, at least 1/cores."""
    own = CPN_THREADS.runnable if own is None else own
    whole = whole_machine_cores() if cores is None else cores
    running = count() if whole > 0 else None
    if running:
        return _without_own(max(running, 1) / whole, own, whole)
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    x = 0
    while True:
        for _ in range(2000):
            x += 1
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        if cpu >= spin_s or wall >= max_wall_s:
            break
    if cpu <= 0:
        return max_wall_s / spin_s
    ratio = wall / cpu
    if ratio > WAITED:
        return _without_own(ratio, own, physical_cores())
    return 1.0


def _without_own(figure: float, own: Callable[[], int | None], cores: int) -> float:
    """``figure`` less cpn's runnable threads per core; as it is where it counts no other
    thread, the cores or cpn's threads are not known."""
    if cores <= 0 or figure * cores <= 1.0:
        return figure
    threads = own()
    if not threads:
        return figure
    return max(1.0 / cores, figure - threads / cores)


@functools.cache
def sees_own_threads() -> bool:
    """Whether this machine's cpn threads can be told apart (/proc readable): the figures then
    leave them out, and the probes' ages are not sent (the server subtracts nothing)."""
    return CPN_THREADS.runnable() is not None


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

    def kept_ages(
        self, now: float | None = None, limit: int = MAX_CONTENTION_PROBES, own_left_out: bool | None = None
    ) -> list[float]:
        """Seconds before ``now`` (monotonic) of the probes the interquartile mean keeps, at most
        ``limit`` (an even subset): the server counts the CPU slots it knew busy on the host at
        those instants, so the figure can be read as the host's load beside them. The figure
        stays while the agent runs its own workers, so its probes can be long past. Empty where
        the figure leaves cpn's own threads out (``sees_own_threads``, or ``own_left_out``):
        there is nothing for the server to subtract."""
        left_out = sees_own_threads() if own_left_out is None else own_left_out
        if left_out:
            return []
        now = time.monotonic() if now is None else now
        ordered = sorted(self._probes, key=lambda p: p[1])
        cut = len(ordered) // 4
        kept = sorted(at for at, _ in ordered[cut : len(ordered) - cut])
        if len(kept) > limit:
            kept = [kept[round(i * (len(kept) - 1) / (limit - 1))] for i in range(limit)]
        # Older than the server reads (a figure kept through a longer job): sent without them.
        return [age for at in kept if (age := max(0.0, now - at)) <= MAX_PROBE_AGE_S]


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
