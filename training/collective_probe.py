"""What a collective among a node's CPU ranks costs: a short gloo all-reduce between two processes.

The reference step runs one process, so it never sees the calls its jobs' data-parallel ranks
make every step (DDP's gradient buckets, the loss). Priced over the fabric's figures they came
to ~6e-5 s a step where two ranks on a 2-core host paid 0.5 ms for 0.44 MB, and four ranks on
the same 2 cores 5.5-6.7 ms even for 4 KB (peers waiting for a core). So the reference worker
forks one peer (torch is loaded already: no second start-up) and times, as two ranks on this
host:

- a small and a large all-reduce, back to back: the small one's time is a call's fixed cost (two
  hops of gloo's ring for two ranks, the hand-off to gloo's thread and back), the difference the
  payload's rate;
- two such pairs on two CPUs, each rank 5 ms of CPU work and then a small all-reduce: four
  ranks on two cores, as where a host runs more ranks than cores. What an iteration takes beyond
  both pairs' work and the call's fixed cost is the wait for a peer to get a core back from the
  other pair's rank, per hop of the ring. (A spinning thread beside each rank does not show it:
  the woken rank preempts a thread that never sleeps; another rank that computes between its
  calls, as a job's ranks do, it waits for.)

The free calls' figures are interquartile means (a call's cost and a rate, without the odd call a
neighbour's burst delayed). The crowded one is a plain mean: most crowded calls find their peer
at once and a few wait about a scheduler slice, and a run of many steps pays that tail. The
whole measurement takes under a second. On a busy host the small calls can take longer than the
large one (each waiting for its peer to get a core): that pair of series is measured again, up to
``FREE_TRIES`` times.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SMALL_BYTES = 4 * 1024  # a call's fixed cost dominates
LARGE_BYTES = 4 * 1024 * 1024  # the payload's rate dominates (~2 ms between two idle cores)
CALLS = {"small": 30, "large": 10, "crowded": 30}
CROWDED_WORK_S = 0.005  # CPU seconds of work before each crowded call (a small model's step)
WARMUP_CALLS = 3
TIMEOUT_S = 20.0
# A busy host can delay the small calls more than the large one takes (its peer waiting for a
# core): such a series says nothing of the payload's rate, so it is measured again.
FREE_TRIES = 3


@dataclass(frozen=True)
class CollectiveFigures:
    """A gloo all-reduce between two CPU ranks of this host (``MeasuredProfile`` fields 242-244)."""

    call_s: float  # seconds of one small all-reduce between two ranks with cores to spare
    gbps: float  # payload rate of a large one beyond that fixed cost, Gb/s
    wait_s: float  # per hop of the ring where ranks outnumber cores: the wait for a peer's turn


def interquartile_mean(samples: Sequence[float]) -> float:
    """Mean of the middle half (a quarter trimmed from each end)."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    q = len(s) // 4
    return statistics.fmean(s[q : len(s) - q])


def fit(
    small_s: Sequence[float], large_s: Sequence[float], crowded_s: Sequence[float], work_s: float
) -> CollectiveFigures:
    """The figures from per-call seconds of the small and the large all-reduce (interquartile
    means) and per-iteration seconds of the crowded runs (two pairs, ``work_s`` CPU seconds each
    rank per iteration; their mean: the waits are the slow tail).

    Two ranks: the ring moves the whole payload once (2(n−1)/n = 1) over two hops, so the large
    call's time beyond the small one's is ``(LARGE − SMALL) / rate``. Crowded, each CPU runs one
    rank of each pair, so an iteration is both pairs' work, a call, and two hops' wait."""
    small, large = interquartile_mean(small_s), interquartile_mean(large_s)
    if not crowded_s:
        raise ValueError("no samples")
    crowded = statistics.fmean(crowded_s)
    extra = large - small
    if not (small > 0 and extra > 0):
        raise ValueError(f"all-reduce times do not separate: small {small:.6f} s, large {large:.6f} s")
    gbps = (LARGE_BYTES - SMALL_BYTES) * 8 / extra / 1e9
    wait = max(0.0, crowded - 2.0 * work_s - small) / 2.0
    return CollectiveFigures(call_s=small, gbps=gbps, wait_s=wait)


def first_separating(
    series: Iterable[tuple[Sequence[float], Sequence[float]]],
) -> tuple[Sequence[float], Sequence[float]]:
    """The first (small, large) series of per-call seconds whose interquartile means separate (the
    large call slower): ``series`` is consumed lazily, so each try is measured only when the one
    before it did not separate. Raises with the last try's means when none does."""
    last = "no series"
    for small_s, large_s in series:
        small, large = interquartile_mean(small_s), interquartile_mean(large_s)
        if small > 0 and large > small:
            return small_s, large_s
        last = f"small {small:.6f} s, large {large:.6f} s"
    raise ValueError(f"all-reduce times do not separate: {last}")


def _rank(
    rank: int, store_path: str, cpu: int | None, spec: list[tuple[str, int]], work_s: float, out: Any
) -> None:
    """One rank: (label, bytes) series of timed all-reduces, each after ``work_s`` CPU seconds of
    work (timed with it); rank 0 puts {label: [seconds]}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    pg = dist.ProcessGroupGloo(dist.FileStore(store_path, 2), rank, 2, timeout)
    times: dict[str, list[float]] = {}
    for label, nbytes in spec:
        t = torch.zeros(nbytes // 4)
        for _ in range(WARMUP_CALLS):
            pg.allreduce([t]).wait()
        series = []
        for _ in range(CALLS[label]):
            t0, c0 = time.perf_counter(), time.thread_time()
            while time.thread_time() - c0 < work_s:
                pass
            pg.allreduce([t]).wait()
            series.append(time.perf_counter() - t0)
        times[label] = series
    if rank == 0:
        out.put(times)
        out.close()
        out.join_thread()


def _child(*args: Any) -> None:
    """A forked rank: measure, then leave at once (the forked interpreter's and the process
    group's teardown would wait on what the parent holds)."""
    code = 1
    try:
        _rank(*args)
        code = 0
    finally:
        os._exit(code)


def _pairs(
    ctx: Any, spec: list[tuple[str, int]], pairs: int, cpus: tuple[int | None, int | None], work_s: float
) -> list[dict[str, list[float]]]:
    """``pairs`` pairs of forked ranks run ``spec`` at once (rank r on ``cpus[r]``); each pair's
    rank 0's seconds."""
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="cpn-collective-") as tmp:
        procs = [
            ctx.Process(target=_child, args=(r, f"{tmp}/store{i}", cpus[r], spec, work_s, out), daemon=True)
            for i in range(pairs)
            for r in (0, 1)
        ]
        for p in procs:
            p.start()
        try:
            return [out.get(timeout=TIMEOUT_S) for _ in range(pairs)]
        finally:
            for p in procs:
                p.join(TIMEOUT_S)
                if p.is_alive():
                    p.kill()


def measure() -> CollectiveFigures:
    """Fork the ranks and time them (see the module docstring)."""
    import torch.distributed  # noqa: F401 (loaded once here: the forked ranks share it, no start-up)

    ctx = mp.get_context("fork")
    spec = [("small", SMALL_BYTES), ("large", LARGE_BYTES)]
    tries = (_pairs(ctx, spec, 1, (None, None), 0.0)[0] for _ in range(FREE_TRIES))
    small, large = first_separating((t["small"], t["large"]) for t in tries)
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, no crowded figure
        return fit(small, large, small, 0.0)
    cpus = (allowed[0], allowed[1 % len(allowed)])
    crowded = _pairs(ctx, [("crowded", SMALL_BYTES)], 2, cpus, CROWDED_WORK_S)
    iterations = [t for got in crowded for t in got["crowded"]]
    return fit(small, large, iterations, CROWDED_WORK_S)
