"""How long jobs on a Slurm cluster really run against their time limits: what the agent's queue
wait estimate (``agent.slurm_queue``) takes for a job's end instead of its limit.

Users ask for limits well above what their jobs run (a job past its limit is killed, one that
ends early costs its owner nothing), so a queue priced by limits runs long. The cluster's own
record of ended jobs says by how much: per kind of job (each user's, and cpn's own tasks apart
from them), the recent ratios of run time to time limit. Read from ``sacct`` where accounting
is on, else from the controller's ``jobcomp/filetxt`` file, followed as it grows.

Pure but for ``JobcompFollower.read_new`` and ``read_sacct``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.slurm_cli import JOBCOMP_TAIL_BYTES, SlurmError, limit_seconds, parse_record, slurm, slurm_time

RECENT_JOBS = 200  # ended jobs kept per kind
OWN_PREFIX = "cpn-"  # the job name the agent gives each task it submits (``agent.slurm``)
OWN = "cpn"
# sacct's window of ended jobs, and the fields read (a job name may hold "|": it goes last).
SACCT_WINDOW = "now-1days"
SACCT_FIELDS = "User,Start,End,Timelimit,NodeList,JobName"
SACCT_EVERY_S = 60.0


def job_kind(user: str, name: str) -> str:
    """Whose job: cpn's own tasks are one kind, every other user's jobs one kind per user."""
    return OWN if name.startswith(OWN_PREFIX) else f"user:{user}"


@dataclass(frozen=True)
class Ended:
    kind: str
    runtime_s: float
    limit_s: float


def _ended(user: str, name: str, start: str, end: str, limit_s: float | None) -> Ended | None:
    began, ended = slurm_time(start), slurm_time(end)
    if began is None or ended is None or limit_s is None or limit_s <= 0 or ended < began:
        return None  # never started (cancelled while pending), or no limit to compare with
    return Ended(job_kind(user, name), ended - began, limit_s)


def ended_from_jobcomp(text: str) -> list[Ended]:
    """Ended jobs in ``jobcomp/filetxt`` records (``UserId=root(0) Name=... TimeLimit=<minutes>
    StartTime=... EndTime=... NodeCnt=...``); a job cancelled while pending (on no node, its
    start its cancel) never ran."""
    out = []
    for line in text.splitlines():
        r = parse_record(line)
        if r.get("NodeCnt") == "0":
            continue
        user = r.get("UserId", "").partition("(")[0]
        limit = limit_seconds(r.get("TimeLimit", ""))
        if (
            e := _ended(user, r.get("Name", ""), r.get("StartTime", ""), r.get("EndTime", ""), limit)
        ) is not None:
            out.append(e)
    return out


def ended_from_sacct(text: str) -> list[Ended]:
    """Ended jobs in ``sacct -P -n -X -o SACCT_FIELDS`` lines; a job cancelled while pending
    (``None assigned``) never ran."""
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|", 5)
        if len(fields) < 6 or fields[4].startswith("None"):
            continue
        user, start, end, limit, _, name = fields
        if (e := _ended(user, name, start, end, limit_seconds(limit))) is not None:
            out.append(e)
    return out


@dataclass
class Runtimes:
    """Recent ended jobs' (run time, limit), per kind."""

    keep: int = RECENT_JOBS
    by_kind: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def add(self, ended: Iterable[Ended]) -> None:
        for e in ended:
            self.by_kind.setdefault(e.kind, deque(maxlen=self.keep)).append((e.runtime_s, e.limit_s))

    def runs(self, kind: str, limit_s: float) -> list[float]:
        """The kind's recent run times as a job of its kind with limit ``limit_s`` would run them.
        A user's jobs scale with their limits (users size a limit to their job, with a margin);
        cpn's own tasks ran as long as they ran (their limits are the quote's margin, at least
        ten minutes, and say little of the run). A user not seen yet takes every other
        user's jobs; cpn's own tasks take none but their own."""
        if kind == OWN:
            return [min(r, limit_s) for r, _ in self.by_kind.get(OWN, ())]
        pairs = self.by_kind.get(kind) or [p for k, ps in self.by_kind.items() if k != OWN for p in ps]
        return [min(1.0, r / limit) * limit_s for r, limit in pairs]

    def end_of_running(self, kind: str, started: float, limit_s: float, now: float) -> float:
        """When a job that started at ``started`` is expected to end: the median run time of the
        kind's jobs that ran longer than it has so far, its limit where none did or nothing is
        known."""
        elapsed = now - started
        longer = [r for r in self.runs(kind, limit_s) if r > elapsed]
        return started + (statistics.median(longer) if longer else limit_s)

    def runtime(self, kind: str, limit_s: float) -> float:
        """How long a job of the kind that has not started yet is expected to run."""
        runs = self.runs(kind, limit_s)
        return statistics.median(runs) if runs else limit_s


class JobcompFollower:
    """Reads the records a ``jobcomp/filetxt`` file gained since the last read (the file's last
    ``JOBCOMP_TAIL_BYTES`` at the first)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset: int | None = None
        self._partial = b""

    def read_new(self) -> str:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if self._offset is None or size < self._offset:  # first read, or the file was rotated
                    self._offset, self._partial = max(0, size - JOBCOMP_TAIL_BYTES), b""
                    cut = self._offset > 0
                else:
                    cut = False
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return ""
        self._offset += len(data)
        data = self._partial + data
        if cut:
            data = data.partition(b"\n")[2]
        whole, _, self._partial = data.rpartition(b"\n")
        return whole.decode(errors="replace")


async def read_sacct() -> list[Ended] | None:
    """The ended jobs of the last day, every user's; None where accounting is off."""
    argv = [
        "sacct",
        "-a",
        "-X",
        "-P",
        "-n",
        "-S",
        SACCT_WINDOW,
        "-s",
        "CD,F,CA,TO,PR,NF,OOM",
        "-o",
        SACCT_FIELDS,
    ]
    try:
        return ended_from_sacct(await slurm(*argv))
    except SlurmError:
        return None


class RuntimeRecord:
    """The cluster's ended jobs as ``Runtimes``, kept current: from ``sacct`` (the last day,
    re-read every ``SACCT_EVERY_S``) where accounting is on, else from the ``jobcomp`` file's new
    records on every refresh."""

    def __init__(self) -> None:
        self.runtimes = Runtimes()
        self._accounting: bool | None = None  # not asked yet
        self._sacct_at = -SACCT_EVERY_S
        self._follower: JobcompFollower | None = None

    async def refresh(self, jobcomp: str, now: float) -> Runtimes:
        """``now``: monotonic seconds; ``jobcomp``: the completion file ('' : none)."""
        if self._accounting is not False and now - self._sacct_at >= SACCT_EVERY_S:
            self._sacct_at = now
            ended = await read_sacct()
            self._accounting = ended is not None
            if ended is not None:
                self.runtimes = Runtimes()
                self.runtimes.add(ended)
        if self._accounting is False and jobcomp:
            if self._follower is None or self._follower.path != jobcomp:
                self._follower = JobcompFollower(jobcomp)
            self.runtimes.add(ended_from_jobcomp(await asyncio.to_thread(self._follower.read_new)))
        return self.runtimes
