"""How long a new cpn task would wait in a Slurm cluster's queue now: what the quote prices as the
cluster's queue wait (``Capacity.queue_wait_s``).

From ``squeue``: the slots running jobs hold and when their time limits end them (the bound Slurm's
own backfill plans with), the slots pending jobs want and, once the backfill scheduler has
computed it, when each is expected to start (``squeue --start``). From the agent's history: the
submit-to-start seconds of its recent jobs that found room at once (the scheduler's own latency).
A new task queues behind the pending jobs (as if of equal priority): it starts once the free
slots, and those the running jobs release in the order their limits end, cover the pending jobs'
and its own. The control plane learns how far this lands from the waits its tasks then measure
(``control_layer.calibration``: per node, and a Slurm cluster is one node to cpn).
"""

from __future__ import annotations

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


def latency_s(history: Sequence[float]) -> float:
    """The scheduler's own delay: the median of recent waits of jobs that found room."""
    return statistics.median(history) if history else 0.0


def queue_wait_estimate(
    jobs: Sequence[QueuedJob], *, free: int, need: int, history: Sequence[float], now: float
) -> float:
    """Seconds a task of ``need`` slots submitted at ``now`` would wait to start."""
    base = latency_s(history)
    pending = [j for j in jobs if j.state == "PENDING"]
    wanted = sum(j.slots for j in pending) + need
    expected = [j.at - now for j in pending if j.at is not None and j.at > now]
    if free >= wanted:
        return base
    released, wait = free, UNKNOWN_END_S
    ends = sorted(
        (j.at if j.at is not None else now + UNKNOWN_END_S, j.slots) for j in jobs if j.state == "RUNNING"
    )
    for end, slots in ends:
        released += slots
        if released >= wanted:
            wait = max(0.0, end - now)
            break
    # The backfill scheduler's own plan for the jobs ahead is a floor: the task starts after them.
    return max(wait, max(expected, default=0.0)) + base


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


def parse_squeue(out: str, *, gpus: bool) -> list[QueuedJob]:
    """``squeue -h -o %T|%S|%e|%C|%b`` lines: state, start, end, CPUs, GRES wanted."""
    jobs = []
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 5 or fields[0] not in ("PENDING", "RUNNING"):
            continue
        state, start, end, cpus, gres = fields[:5]
        slots = gres_gpus(gres.replace("gres/", ""))[1] if gpus else int(cpus) if cpus.isdigit() else 0
        jobs.append(QueuedJob(state, slots, _unix(end if state == "RUNNING" else start)))
    return jobs


async def read_queue(partition: str, *, gpus: bool) -> list[QueuedJob]:
    """The partition's running and pending jobs, every user's."""
    argv = ["squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%T|%S|%e|%C|%b"]
    if partition:
        argv.append(f"--partition={partition}")
    return parse_squeue(await slurm(*argv), gpus=gpus)
