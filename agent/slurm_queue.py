"""How long a new cpn task would wait in a Slurm cluster's queue now: what the quote prices as the
cluster's queue wait (``Capacity.queue_wait_s``).

From ``squeue``: the slots running jobs hold and when their time limits end them (the bound Slurm's
own backfill plans with), the slots pending jobs want and, once the backfill scheduler has
computed it, when each is expected to start (``squeue --start``). From the agent's history: the
submit-to-start seconds of its recent jobs that found room at once (the scheduler's own latency).
A new task queues behind the pending jobs (as if of equal priority, first come first served): each
job ahead, then the task, starts once enough slots are free, and every job frees its slots when
its time limit would end it. The control plane learns how far this lands from the waits its tasks then measure
(``control_layer.calibration``: per node, and a Slurm cluster is one node to cpn).
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from agent.slurm_cli import slurm
from agent.slurm_nodes import gres_gpus

HISTORY = 20  # recent submit-to-start waits kept
UNKNOWN_END_S = 24 * 3600.0  # a running job without a time limit: assumed to hold its slots a day


@dataclass(frozen=True)
class QueuedJob:
    state: str  # PENDING or RUNNING
    slots: int  # CPUs (or GPUs) it holds or wants
    at: float | None  # unix seconds: a running job's end by its limit, a pending one's expected start
    limit_s: float | None = None  # its time limit (None: none, or not known)


def latency_s(history: Sequence[float]) -> float:
    """The scheduler's own delay: the median of recent waits of jobs that found room."""
    return statistics.median(history) if history else 0.0


def queue_wait_estimate(
    jobs: Sequence[QueuedJob], *, free: int, need: int, history: Sequence[float], now: float
) -> float:
    """Seconds a task of ``need`` slots submitted at ``now`` would wait to start: first come,
    first served, each pending job ahead (then the task) starts once enough slots are free, and a
    job frees its slots when its limit ends it (the bound Slurm's backfill plans with)."""
    base = latency_s(history)
    pending = [j for j in jobs if j.state == "PENDING"]
    if free >= sum(j.slots for j in pending) + need:
        return base
    ends = [
        (j.at if j.at is not None else now + UNKNOWN_END_S, j.slots) for j in jobs if j.state == "RUNNING"
    ]
    heapq.heapify(ends)
    at, available = now, free
    for slots, limit in [(j.slots, j.limit_s) for j in pending] + [(need, None)]:
        while available < slots and ends:
            end, freed = heapq.heappop(ends)
            at, available = max(at, end), available + freed
        if available < slots:  # more than the cluster ever frees
            return UNKNOWN_END_S + base
        available -= slots
        heapq.heappush(ends, (at + (limit if limit is not None else UNKNOWN_END_S), slots))
    # The backfill scheduler's own plan for the jobs ahead is a floor: the task starts after them.
    expected = [j.at - now for j in pending if j.at is not None and j.at > now]
    return max(at - now, max(expected, default=0.0)) + base


def coarse_wait_s(seconds: float) -> float:
    """A wait on the grid it is reported on: half seconds below 10 s, then two significant
    digits (the quote needs no more, and each report is a write the planner re-reads)."""
    if seconds < 10:
        return round(seconds * 2) / 2
    return float(f"{seconds:.2g}")


def _unix(text: str) -> float | None:
    """Slurm's local ISO time (``2026-11-29T12:31:09``); None for N/A, Unknown, UNLIMITED."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def limit_seconds(text: str) -> float | None:
    """Slurm's time limit: ``[D-]HH:MM:SS``, ``MM:SS`` or minutes; None for UNLIMITED or N/A."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    try:
        numbers = [int(x) for x in parts]
        whole_days = int(days) if days else 0
    except ValueError:
        return None
    if len(numbers) == 1:
        return 60.0 * numbers[0] + 86400.0 * whole_days
    seconds = 0
    for n in numbers:
        seconds = seconds * 60 + n
    return float(seconds + 86400 * whole_days)


def parse_squeue(out: str, *, gpus: bool) -> list[QueuedJob]:
    """``squeue -h -o %T|%S|%e|%C|%b|%l`` lines: state, start, end, CPUs, GRES wanted, limit."""
    jobs = []
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 6 or fields[0] not in ("PENDING", "RUNNING"):
            continue
        state, start, end, cpus, gres, limit = fields[:6]
        slots = gres_gpus(gres.replace("gres/", ""))[1] if gpus else int(cpus) if cpus.isdigit() else 0
        jobs.append(
            QueuedJob(state, slots, _unix(end if state == "RUNNING" else start), limit_seconds(limit))
        )
    return jobs


async def read_queue(partition: str, *, gpus: bool) -> list[QueuedJob]:
    """The partition's running and pending jobs, every user's."""
    argv = ["squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%T|%S|%e|%C|%b|%l"]
    if partition:
        argv.append(f"--partition={partition}")
    return parse_squeue(await slurm(*argv), gpus=gpus)
