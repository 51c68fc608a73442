"""Where a task's workers run: one interface, two backends.

``local`` (the default) starts the worker command as a process tree under a keeper
(``contracts.lifetime``), on this node's devices. ``slurm`` (``agent.slurm``) submits it as a
Slurm batch job, and Slurm runs it where and when it decides. ``WorkerRun`` prepares the
command, forwards what it prints and reports how it ended; it does not care which backend ran it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts.lifetime import keeper_command, kill_tree

READ_LIMIT = 1 << 20


@dataclass(frozen=True)
class TaskShape:
    """What a task asks of its scheduler: a name, its processes and devices, its time limit."""

    name: str
    nproc: int
    gpus: int  # 0: CPU slots only (one CPU per process)
    time_limit_s: float


class Launched(Protocol):
    """One launched task's workers."""

    label: str  # how logs and status messages name it: "pid 123", "slurm job 45"
    pgid: int | None  # its local process group; None elsewhere
    record: dict[str, str | int]  # what the agent's state file keeps, to stop it after a crash
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    end_cause: str | None  # set once ended where the scheduler (not the workers) ended the task
    lost: bool  # ended from outside the task (preempted, its node failed, out of time)

    @property
    def returncode(self) -> int | None: ...

    async def started(self) -> bool:
        """Wait until the workers run (True) or the task ended without running (False)."""
        ...

    async def wait(self) -> int:
        """The workers' exit code, once every process of the task is gone."""
        ...

    def terminate(self) -> None:
        """Ask the workers to stop (SIGTERM); the backend ends them after its grace period."""

    def kill(self) -> None:
        """End whatever is left at once."""


class Launcher(Protocol):
    name: str
    queue_wait_s: float  # how long a task launched now is expected to wait to start

    async def launch(
        self, cmd: list[str], *, cwd: Path, env: dict[str, str], grace_s: float, shape: TaskShape
    ) -> Launched: ...


class LocalProcess:
    """A worker tree under a keeper: SIGTERM to the keeper's group stops it, the keeper ends the
    whole tree after the grace period."""

    end_cause: str | None = None
    lost = False

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pgid: int | None = proc.pid
        self.record: dict[str, str | int] = {"pgid": proc.pid}
        self.label = f"pid {proc.pid}"
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout, self.stderr = proc.stdout, proc.stderr

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def started(self) -> bool:
        return True

    async def wait(self) -> int:
        return await self._proc.wait()

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        kill_tree(self._proc.pid)


class LocalLauncher:
    """torchrun subprocesses on this node, under a keeper (the agent's default)."""

    name = "local"
    queue_wait_s = 0.0  # its workers start at once

    async def launch(
        self, cmd: list[str], *, cwd: Path, env: dict[str, str], grace_s: float, shape: TaskShape
    ) -> Launched:
        kept, fds = keeper_command(cmd, grace_s=grace_s)
        proc = await asyncio.create_subprocess_exec(
            *kept,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=fds,
            start_new_session=True,
            limit=READ_LIMIT,
        )
        return LocalProcess(proc)
