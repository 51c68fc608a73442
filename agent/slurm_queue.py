"""How long a new cpn task would wait in a Slurm cluster's queue now: what the quote prices as the
cluster's queue wait (``Capacity.queue_wait_s``).

From ``squeue``: the slots running jobs hold, since when, and their time limits; the slots pending
jobs want and, once the backfill scheduler has computed it, when each is expected to start
(``squeue --start``). From the cluster's record of ended jobs (``agent.slurm_history``): how long
jobs of each kind (each user's, cpn's own) really run against their limits. From the agent's
history: the submit-to-start seconds of its recent jobs that found room at once (the scheduler's
own latency). A new task queues behind the pending jobs (as if of equal priority, first come first
served): each job ahead, then the task, starts once enough slots are free. A running job frees its
slots when jobs of its kind that ran as long as it has so far went on to end (the median of their
run times; its limit where none ran that long, or nothing is known); a job ahead, once started,
runs its kind's median share of its limit. Slurm's own planned start for a job ahead caps when it
starts (Slurm plans with limits, so a start it gives is a start at the latest). The control plane
learns how far this lands from the waits its tasks then measure (``control_layer.calibration``:
per node, and a Slurm cluster is one node to cpn), at each task's start.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from agent.slurm_cli import limit_seconds, slurm, slurm_time
from agent.slurm_history import Runtimes, job_kind
from agent.slurm_nodes import gres_gpus
from contracts.registration import MAX_QUEUE_WAIT_S

HISTORY = 20  # recent submit-to-start waits kept
UNKNOWN_END_S = 24 * 3600.0  # a running job without a time limit: assumed to hold its slots a day


@dataclass(frozen=True)
class QueuedJob:
    state: str  # PENDING, RUNNING or COMPLETING (ended, its slots not yet released)
    slots: int  # CPUs (or GPUs) it holds or wants
    at: float | None  # unix seconds: a running job's end by its limit, a pending one's expected start
    limit_s: float | None = None  # its time limit (None: none, or not known)
    started: float | None = None  # unix seconds: a running job's start
    kind: str = ""  # whose (``agent.slurm_history.job_kind``)


def latency_s(history: Sequence[float]) -> float:
    """The scheduler's own delay: the median of recent waits of jobs that found room."""
    return statistics.median(history) if history else 0.0


def running_end(job: QueuedJob, runtimes: Runtimes | None, now: float) -> float:
    """When a running job is expected to free its slots: as its kind's ended jobs that ran as long
    went on to (``Runtimes.end_of_running``), never past its limit; without a start or a limit,
    at its limit's end or a day on."""
    by_limit = job.at if job.at is not None else now + UNKNOWN_END_S
    if runtimes is None or job.started is None or job.limit_s is None:
        return by_limit
    return min(by_limit, runtimes.end_of_running(job.kind, job.started, job.limit_s, now))


def queue_wait_estimate(
    jobs: Sequence[QueuedJob],
    *,
    free: int,
    need: int,
    history: Sequence[float],
    now: float,
    runtimes: Runtimes | None = None,
) -> float:
    """Seconds a task of ``need`` slots submitted at ``now`` would wait to start: first come,
    first served, each pending job ahead (then the task) starts once enough slots are free, and
    a job frees its slots when jobs like it end (``runtimes``; by its limit without them). At
    most ``MAX_QUEUE_WAIT_S``: the control plane refuses more, and with it the devices the same
    report says are unavailable."""
    base = latency_s(history)
    pending = [j for j in jobs if j.state == "PENDING"]
    if free >= sum(j.slots for j in pending) + need:
        return base
    ends = [
        (now if j.state == "COMPLETING" else max(now, running_end(j, runtimes, now)), j.slots)
        for j in jobs
        if j.state != "PENDING"
    ]
    heapq.heapify(ends)
    at, available = now, free
    for job in [*pending, None]:
        slots = job.slots if job is not None else need
        while available < slots and ends:
            end, freed = heapq.heappop(ends)
            at, available = max(at, end), available + freed
        if available < slots:  # more than the cluster ever frees
            return min(UNKNOWN_END_S + base, MAX_QUEUE_WAIT_S)
        if job is None:
            break
        start = min(at, job.at) if job.at is not None and job.at > now else at
        available -= slots
        limit = job.limit_s if job.limit_s is not None else UNKNOWN_END_S
        runs = (
            runtimes.runtime(job.kind, limit) if runtimes is not None and job.limit_s is not None else limit
        )
        heapq.heappush(ends, (start + runs, slots))
    return min(at - now + base, MAX_QUEUE_WAIT_S)


def coarse_wait_s(seconds: float) -> float:
    """A wait on the grid it is reported on: half seconds below 10 s, then two significant
    digits (the quote needs no more, and each report is a write the planner re-reads), never
    past ``MAX_QUEUE_WAIT_S`` (which two digits would round up)."""
    if seconds < 10:
        return round(seconds * 2) / 2
    return min(float(f"{seconds:.2g}"), MAX_QUEUE_WAIT_S)


FORMAT = "%T|%S|%e|%C|%b|%l|%u|%j"  # the job's name last: it may hold "|"


def parse_squeue(out: str, *, gpus: bool) -> list[QueuedJob]:
    """``squeue -h -o FORMAT`` lines: state, start (a running job's, or a pending one's expected
    start), end, CPUs, GRES wanted, limit, user, name."""
    jobs = []
    for line in out.splitlines():
        fields = line.strip().split("|", 7)
        if len(fields) < 8 or fields[0] not in ("PENDING", "RUNNING", "COMPLETING"):
            continue
        state, start, end, cpus, gres, limit, user, name = fields
        slots = gres_gpus(gres.replace("gres/", ""))[1] if gpus else int(cpus) if cpus.isdigit() else 0
        running = state != "PENDING"
        limit_s = limit_seconds(limit)
        # Slurm lists an unlimited running job's end a year after its start: a placeholder, no end.
        at = (slurm_time(end) if limit_s is not None else None) if running else slurm_time(start)
        jobs.append(
            QueuedJob(
                state,
                slots,
                at,
                limit_s,
                started=slurm_time(start) if running else None,
                kind=job_kind(user, name),
            )
        )
    return jobs


async def read_queue(partition: str, *, gpus: bool) -> list[QueuedJob]:
    """The partition's pending, running and completing jobs, every user's (a completing job holds
    its slots until Slurm has cleaned up after it)."""
    argv = ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING", "-o", FORMAT]
    if partition:
        argv.append(f"--partition={partition}")
    return parse_squeue(await slurm(*argv), gpus=gpus)
