"""The ``slurm`` backend: each cpn task is one Slurm batch job.

The agent runs on a login or service node and never starts workers itself: ``sbatch`` submits
the worker command with the task's processes, CPUs or GPUs (GRES) and time limit, in the
provider's partition and account. Slurm starts it when the cluster's own users leave room; until
then the task stays STARTING. The job writes its output to files in the task's run directory
(which must be on a filesystem the compute nodes share with the agent); the agent follows them,
asks ``squeue`` whether the job still lives and, once it has left the queue, ``scontrol show job``
(or ``sacct``) how it ended. ``scancel`` stops it: SIGTERM, then SIGKILL after Slurm's ``KillWait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shlex
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from agent.launchers import READ_LIMIT, Launched, TaskShape
from agent.slurm_cli import (
    CLI_TIMEOUT_S,
    LIVE_STATES,
    LOST_STATES,
    JobEnd,
    SlurmError,
    job_end,
    job_state,
    jobcomp_file,
    slurm,
)
from agent.slurm_history import RuntimeRecord
from agent.slurm_nodes import cluster_nodes
from agent.slurm_queue import HISTORY
from agent.slurm_srun import NodeSplit, split_over_nodes, srun_script

log = logging.getLogger(__name__)

SCRIPT = "slurm_job.sh"
STDOUT, STDERR = "slurm_stdout.log", "slurm_stderr.log"
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})


def sbatch_args(
    shape: TaskShape, *, cwd: Path, partition: str, account: str, split: NodeSplit | None = None
) -> list[str]:
    """``sbatch`` options for one task: a process per device (or CPU slot), on one node or spread
    as ``split`` says (one torchrun task per node, each with its share of the devices)."""
    split = split or NodeSplit(1, shape.gpus or shape.nproc)
    minutes = max(1, math.ceil(shape.time_limit_s / 60))
    args = [
        "--parsable",
        f"--job-name=cpn-{shape.name}",
        f"--chdir={cwd}",
        f"--output={cwd / STDOUT}",
        f"--error={cwd / STDERR}",
        "--open-mode=append",
        f"--nodes={split.nodes}",
        f"--ntasks={split.nodes}",  # a torchrun per node: it starts the node's ranks itself
        "--ntasks-per-node=1",
        f"--time={minutes}",
        "--export=ALL",  # the worker environment the agent prepared (sbatch runs with it)
    ]
    if shape.gpus:
        args.append(f"--gres=gpu:{split.per_node}")
    else:
        args.append(f"--cpus-per-task={split.per_node}")
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    return args


def end_of(job_id: str, end: JobEnd | None, cancelled_here: bool) -> tuple[int, str | None, bool]:
    """(exit code, why the scheduler ended it or None, whether the task was lost rather than
    failed) for a job that ended as ``end`` says."""
    if end is None:
        return 1, f"Slurm no longer knows job {job_id} (not in squeue, scontrol or sacct)", True
    code = end.exit_code or (128 + end.signal if end.signal else 0)
    if end.state == "COMPLETED":
        return code, None, False
    code = code or 1
    if end.state == "OUT_OF_MEMORY":
        return code, f"out of memory: Slurm killed job {job_id} at its memory limit", False
    if end.state in LOST_STATES:
        return code, f"Slurm ended job {job_id} as {end.state}", True
    if end.state == "CANCELLED" and not cancelled_here:
        return code, f"Slurm job {job_id} was cancelled outside cpn (scancel)", True
    if end.state == "FAILED":
        return code, None, False  # the workers' own failure: their error says why
    return code, f"Slurm ended job {job_id} as {end.state}", False


class SlurmJob:
    """One submitted job, followed until it has left Slurm's queue."""

    pgid: int | None = None

    def __init__(
        self,
        job_id: str,
        cwd: Path,
        poll_s: float,
        jobcomp: str = "",
        on_start: Callable[[float], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self._jobcomp = jobcomp
        self._on_start = on_start  # told the submit-to-start seconds once it runs
        self._submitted = time.monotonic()
        self.label = f"slurm job {job_id}"
        self.record: dict[str, str | int] = {"slurm_job": job_id}
        self.stdout = asyncio.StreamReader(limit=READ_LIMIT)
        self.stderr = asyncio.StreamReader(limit=READ_LIMIT)
        self.end_cause: str | None = None
        self.lost = False
        self.state = "PENDING"
        self._cwd = cwd
        self._poll_s = poll_s
        self._offsets = {STDOUT: 0, STDERR: 0}
        self._returncode: int | None = None
        self._running = asyncio.Event()
        self._done = asyncio.Event()
        self._cancelled_here = False
        self._orders: set[asyncio.Task[None]] = set()
        self._follow = asyncio.create_task(self._follow_job())

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def started(self) -> bool:
        waits = [asyncio.create_task(self._running.wait()), asyncio.create_task(self._done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the caller gives up waiting (a start deadline)
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return self._running.is_set()

    async def wait(self) -> int:
        await self._done.wait()
        assert self._returncode is not None
        return self._returncode

    def terminate(self) -> None:
        self._cancelled_here = True
        self._order("scancel", self.job_id)

    def kill(self) -> None:
        self._cancelled_here = True
        self._order("scancel", "--signal=KILL", "--full", self.job_id)

    def _order(self, *argv: str) -> None:
        async def send() -> None:
            try:
                await slurm(*argv)
            except SlurmError as exc:
                log.warning("%s: %s", self.label, exc)

        task = asyncio.create_task(send())
        self._orders.add(task)
        task.add_done_callback(self._orders.discard)

    def _read_new(self) -> None:
        """Feed what the job has written since the last look to the two streams."""
        for name, stream in ((STDOUT, self.stdout), (STDERR, self.stderr)):
            try:
                with open(self._cwd / name, "rb") as f:
                    f.seek(self._offsets[name])
                    data = f.read()
            except FileNotFoundError:
                continue
            self._offsets[name] += len(data)
            if data:
                stream.feed_data(data)

    async def _follow_job(self) -> None:
        try:
            while True:
                try:
                    state = await job_state(self.job_id)
                except SlurmError as exc:  # the controller is away for a moment: ask again
                    log.warning("%s: %s", self.label, exc)
                    state = self.state
                self._read_new()
                if state is not None and state in RUNNING_STATES and not self._running.is_set():
                    self._running.set()
                    if self._on_start is not None:
                        self._on_start(time.monotonic() - self._submitted)
                if state is None or state not in LIVE_STATES:
                    break
                self.state = state
                await asyncio.sleep(self._poll_s)
            end = await job_end(self.job_id, self._jobcomp)
            self.state = end.state if end is not None else "UNKNOWN"
            code, self.end_cause, self.lost = end_of(self.job_id, end, self._cancelled_here)
            self._read_new()
            if end is not None and (end.state != "CANCELLED" or any(self._offsets.values())):
                self._running.set()  # it ran, between two looks: it was not withdrawn from the queue
            self._returncode = code
        finally:
            for stream in (self.stdout, self.stderr):
                stream.feed_eof()
            if self._returncode is None:
                self._returncode = 1
            self._done.set()


def cancel_leftover_job(job_id: str, assignment_id: str) -> bool:
    """``scancel`` a job a previous agent process submitted and left queued or running (one
    killed itself, say), if Slurm still holds it under the name cpn gave it: an id Slurm has
    since given another user's job is never cancelled."""
    try:
        name = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%j"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
        ).stdout.strip()
        if name != f"cpn-{assignment_id}":
            return False
        subprocess.run(["scancel", job_id], capture_output=True, timeout=CLI_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not cancel Slurm job %s left by a previous agent: %s", job_id, exc)
        return False
    return True


class SlurmLauncher:
    """Submits each task as a batch job in ``partition`` under ``account`` ('' : Slurm's default).
    ``jobcomp``: the controller's job completion file; None: asked of Slurm at the first launch.
    A task larger than the partition's biggest node runs over several (``agent.slurm_srun``);
    ``srun``: every task runs as an srun step, on one node too (for clusters that account steps)."""

    name = "slurm"

    def __init__(
        self,
        *,
        partition: str = "",
        account: str = "",
        poll_s: float = 1.0,
        jobcomp: str | None = None,
        srun: bool = False,
    ) -> None:
        self.partition, self.account, self.poll_s = partition, account, poll_s
        self.jobcomp = jobcomp
        self.srun = srun
        self._node_slots: tuple[int, int] | None = None  # the biggest node's (GPUs, CPUs)
        # The queue wait a task launched now is expected to see (``agent.slurm_queue``, re-read
        # with the cluster's capacity), and the submit-to-start waits of recent jobs that found
        # room at once: the scheduler's own latency.
        self.queue_wait_s = 0.0
        self.room_now = True
        self.waits: deque[float] = deque(maxlen=HISTORY)
        self.ended = RuntimeRecord()  # how long the cluster's jobs run against their limits

    def _started_after(self, room: bool) -> Callable[[float], None]:
        def note(seconds: float) -> None:
            if room:
                self.waits.append(seconds)

        return note

    async def split(self, shape: TaskShape) -> NodeSplit:
        """Over how many nodes the task runs: as few as hold its slots, its processes in equal
        shares (one node where they would not divide)."""
        if self._node_slots is None:
            nodes = await cluster_nodes(self.partition)
            self._node_slots = (
                max((n.gpus for n in nodes), default=0),
                max((n.cpus for n in nodes), default=0),
            )
        per_node = self._node_slots[0] if shape.gpus else self._node_slots[1]
        split = split_over_nodes(shape.gpus or shape.nproc, per_node)
        if split.nodes > 1 and shape.nproc % split.nodes:
            return NodeSplit(1, shape.gpus or shape.nproc)
        return split

    async def launch(
        self, cmd: list[str], *, cwd: Path, env: dict[str, str], grace_s: float, shape: TaskShape
    ) -> Launched:
        try:
            split = await self.split(shape)
        except SlurmError as exc:
            raise OSError(f"could not read the partition's nodes: {exc}") from None
        script = cwd / SCRIPT
        if split.nodes > 1 or self.srun:
            try:
                script.write_text(srun_script(cmd, split))
            except ValueError as exc:
                raise OSError(f"task over {split.nodes} Slurm node(s): {exc}") from None
        else:
            # exec: the batch step is the worker command itself, so Slurm's signals reach it.
            script.write_text(f"#!/bin/sh\nexec {shlex.join(cmd)}\n")
        script.chmod(0o755)
        args = sbatch_args(shape, cwd=cwd, partition=self.partition, account=self.account, split=split)
        argv = ["sbatch", *args]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            str(script),
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise OSError(f"sbatch refused the task: {err.decode(errors='replace').strip()}")
        job_id = out.decode().strip().split(";")[0]  # "ID" or "ID;CLUSTER"
        if self.jobcomp is None:
            self.jobcomp = await jobcomp_file()
        log.info("task %s: submitted as Slurm job %s", shape.name, job_id)
        with contextlib.suppress(OSError):
            (cwd / "slurm_job_id").write_text(job_id)
        return SlurmJob(job_id, cwd, self.poll_s, self.jobcomp, on_start=self._started_after(self.room_now))
