"""Slurm's command-line tools, called with their parsable output flags (never a human table):
``squeue -h -o``, ``scontrol show ... -o`` (one ``Key=Value`` record per line), ``sacct -P -n``.
Which cluster they reach is theirs to decide: ``SLURM_CONF`` in the agent's environment, or the
node's own configuration."""

from __future__ import annotations

import asyncio
import re
import shlex
from dataclasses import dataclass
from datetime import datetime

CLI_TIMEOUT_S = 30.0
# How much of the end of a jobcomp file is read for a job's end: a job that left the queue has
# just ended, so its record is among the last ones (some thousand jobs' worth).
JOBCOMP_TAIL_BYTES = 4 << 20
# Slurm states in which a job may still run (or is about to).
LIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
    }
)
# Ends where the task itself was fine: the cluster took it away. Its task is re-placed and resumes
# from its checkpoint, as after a lost local node.
LOST_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE"})
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


def slurm_time(text: str) -> float | None:
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


class SlurmError(Exception):
    """A Slurm command failed; the message is its own."""


async def slurm(*argv: str, check: bool = True) -> str:
    """Run one Slurm command; its stdout. Raises SlurmError on a non-zero exit when ``check``."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmError(f"{shlex.join(argv)}: no answer within {CLI_TIMEOUT_S:g}s") from None
    if check and proc.returncode != 0:
        message = err.decode(errors="replace").strip() or f"exit {proc.returncode}"
        raise SlurmError(f"{argv[0]}: {message}")
    return out.decode(errors="replace")


def parse_record(line: str) -> dict[str, str]:
    """One line of ``scontrol show ... -o``: ``Key=Value`` pairs split on spaces. A value may hold
    spaces (``Reason=Not responding``), so each value runs up to the next ``Key=``."""
    keys = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        record[m.group(1)] = line[m.end() : end].strip()
    return record


@dataclass(frozen=True)
class JobEnd:
    """How Slurm says a job ended."""

    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, ...
    exit_code: int  # the batch script's exit code
    signal: int  # the signal that ended it, 0 if none
    reason: str = ""


def _exit_pair(text: str) -> tuple[int, int]:
    """Slurm's ``CODE:SIGNAL``."""
    code, _, sig = text.partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 0, 0


def job_end_from_scontrol(record: dict[str, str]) -> JobEnd:
    code, sig = _exit_pair(record.get("ExitCode", "0:0"))
    state = record.get("JobState", "UNKNOWN").split()[0]
    return JobEnd(state, code, sig, record.get("Reason", ""))


def job_end_from_sacct(line: str) -> JobEnd | None:
    """A ``sacct -P -n -X -o State,ExitCode`` line; ``CANCELLED by 0`` keeps its first word."""
    fields = line.strip().split("|")
    if len(fields) < 2 or not fields[0]:
        return None
    code, sig = _exit_pair(fields[1])
    return JobEnd(fields[0].split()[0], code, sig)


async def job_state(job_id: str) -> str | None:
    """The job's state while Slurm's queue still holds it; None once it has left the queue."""
    out = await slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
    state = out.strip().split("\n")[0].strip()
    return state or None


def job_end_from_jobcomp(text: str, job_id: str) -> JobEnd | None:
    """The job's end in a ``jobcomp/filetxt`` file: one ``Key=Value`` record per ended job, the
    last one counting (a requeued job ends more than once)."""
    end = None
    for line in text.splitlines():
        record = parse_record(line)
        if record.get("JobId") == job_id:
            end = job_end_from_scontrol(record)
    return end


def read_tail(path: str, limit: int = JOBCOMP_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a file ('' if it cannot be read), from a line's start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    if size > limit:
        data = data.partition(b"\n")[2]  # the first line was cut
    return data.decode(errors="replace")


async def jobcomp_file() -> str:
    """Where the controller writes each ended job when its completion plugin is ``jobcomp/filetxt``
    ('' otherwise): how a job's end is still known once ``scontrol`` has forgotten it and there is
    no accounting (``sacct``)."""
    try:
        out = await slurm("scontrol", "show", "config")
    except SlurmError:
        return ""
    config = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines())}
    if config.get("JobCompType") != "jobcomp/filetxt":
        return ""
    return config.get("JobCompLoc", "")


async def job_end(job_id: str, jobcomp: str = "") -> JobEnd | None:
    """How a job that left the queue ended: ``scontrol show job`` while the controller remembers
    it (``MinJobAge``), else ``sacct`` where accounting is on, else the ``jobcomp`` file where
    one is kept; None if none knows."""
    out = await slurm("scontrol", "show", "job", "-o", job_id, check=False)
    for line in out.splitlines():
        record = parse_record(line)
        if record.get("JobId") == job_id:
            return job_end_from_scontrol(record)
    try:
        out = await slurm("sacct", "-P", "-n", "-X", "-j", job_id, "-o", "State,ExitCode")
    except SlurmError:
        out = ""  # accounting is off (or away): the completion file may know
    for line in out.splitlines():
        if (end := job_end_from_sacct(line)) is not None:
            return end
    if jobcomp:
        return job_end_from_jobcomp(await asyncio.to_thread(read_tail, jobcomp), job_id)
    return None
