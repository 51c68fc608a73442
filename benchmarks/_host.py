"""The host a benchmark ran on: its speed, a figure scaled to the slower hosts of its kind, and
other tenants' work beside it, and how long a benchmark waits for its own parts on it.

A figure measured on one host is a figure of that host: hosts of the same kind have differed by
1.8x from one day to the next (BENCHMARKS.md). The host loop is the time of a fixed Python loop,
10 million additions at module scope (global names, as ``python -c`` runs them; a loop inside a
function runs about twice as fast), the best of three. The slower hosts of this kind take about
``SLOW_HOST_LOOP_S`` for it; a latency figure scaled to them is the figure × max(1, that ÷ this
host's loop), so a figure taken on a faster host is not mistaken for one that holds everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import time
from collections.abc import Iterator

# The idle loop time of the slower hosts of this kind (issue 33: about 1.1 s).
SLOW_HOST_LOOP_S = 1.1
LOOP = compile("x = 0\nfor i in range(10_000_000):\n    x += i\n", "<host loop>", "exec")


def host_loop_s(runs: int = 3) -> float:
    """Seconds of the fixed loop on this host, the best of ``runs``."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        exec(LOOP, {})  # module scope: the loop's names are globals, as in a bare script
        best = min(best, time.perf_counter() - t0)
    return best


def at_slow_host(figure: float, loop_s: float) -> float:
    """``figure`` (a latency) as it would read on the slower hosts of this kind."""
    return figure * max(1.0, SLOW_HOST_LOOP_S / loop_s)


@functools.cache
def pace() -> float:
    """How much slower than the slower hosts of this kind this host runs now (at least 1): the
    fixed loop once, measured the first time a wait asks (busy loops already running count)."""
    return max(1.0, host_loop_s(runs=1) / SLOW_HOST_LOOP_S)


def patience(base_s: float) -> float:
    """The ceiling of a wait for the benchmark's own parts (agents measuring their profile, a
    replica starting, a job finishing): ``base_s`` is what the slower hosts of this kind need
    with room to spare, scaled by this host's ``pace``. A ceiling: a wait ends at its event, and
    the error at the ceiling says what it waited for."""
    return base_s * pace()


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes beside the benchmark for as long as the block runs, as other
    tenants' work on a shared host; ended with it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
