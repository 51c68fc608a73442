"""Running users' code under bubblewrap: the argv that confines a worker group, the rlimits it
starts with, the probe that says whether this node can confine at all, and the disk guard.

The sandbox sees the node's root read-only (the Python installation, site-packages), a private
/tmp, /dev/shm and /proc (its own PID namespace: no process of the node is visible, so none can be
signalled), the task's own directories writable and its staged inputs read-only. The agent's work
dir (node key, state file, other tasks' directories) is covered by an empty tmpfs. The network is
shared: workers reach their torchrun store and their peers in other regions.

RLIMIT_AS is not set: CUDA reserves far more address space than it uses, and large mmaps of
datasets would fail too. RLIMIT_NPROC is not set either: it counts every process of the uid, and
an agent running as root is exempt from it; bound a node's processes and memory with its cgroup
(for instance the agent's systemd unit's TasksMax and MemoryMax).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.settings import AgentSettings
from contracts.errors import InvalidArgument
from contracts.registration import SANDBOX_BUBBLEWRAP, SANDBOX_NONE, SANDBOX_UNSANDBOXED_ALLOWED

BWRAP = "bwrap"
PRLIMIT = "prlimit"
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
GIB = 1024**3
NOFILE_PER_DEVICE = 16384  # torch's data loaders and gloo's sockets: generous, but bounded
MIN_NOFILE = 4096
# The environment the agent was started with may hold its enrollment token.
HIDDEN_ENV = ("CPN_AGENT_TOKEN",)
# A task is stopped by SIGTERM to its process group (its keeper forwards the agent's), then SIGKILL
# after a grace period. bwrap would die of the SIGTERM at once and, dying, SIGKILL the sandbox
# (--die-with-parent): so bwrap runs with SIGTERM ignored, and the task's command with it
# restored, to end on its own terms.
IGNORE_TERM = ("sh", "-c", 'trap "" TERM; exec "$0" "$@"')
DEFAULT_TERM = (
    "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_DFL);"
    " os.execvp(sys.argv[1], sys.argv[1:])"
)
# Each GPU's own node plus the driver's shared ones (present or not, depending on the driver).
NVIDIA_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def needs_sandbox(worker_config: Mapping[str, Any]) -> bool:
    """User code (an ``entrypoint``) runs sandboxed unless its stage section says otherwise."""
    if not worker_config.get("entrypoint"):
        return False
    stage = worker_config.get("stage")
    return not (isinstance(stage, dict) and stage.get("sandbox") is False)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-process rlimits a sandboxed worker starts with (``prlimit`` before ``bwrap``)."""

    fsize_bytes: int  # one file may not outgrow the task's disk quota (SIGXFSZ)
    nofile: int
    core_bytes: int = 0  # no core dumps: they would land in the task dir, past its quota

    def argv(self) -> list[str]:
        return [
            PRLIMIT,
            f"--fsize={self.fsize_bytes}",
            f"--nofile={self.nofile}",
            f"--core={self.core_bytes}",
            "--",
        ]


def task_limits(settings: AgentSettings, device_count: int, nofile_hard: int | None = None) -> SandboxLimits:
    """The rlimits of a task holding ``device_count`` of the node's devices; never above the
    agent's own hard limit (default: read), which a process without CAP_SYS_RESOURCE cannot raise."""
    if nofile_hard is None:
        nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = max(MIN_NOFILE, NOFILE_PER_DEVICE * max(1, device_count))
    if nofile_hard != resource.RLIM_INFINITY:
        want = min(want, nofile_hard)
    return SandboxLimits(fsize_bytes=disk_quota_bytes(settings), nofile=want)


def disk_quota_bytes(settings: AgentSettings) -> int:
    return int(settings.task_disk_gb * GIB)


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: dict[str, Path] = {}
    for p in paths:
        seen.setdefault(str(p), p)
    return list(seen.values())


def hidden_dirs(settings: AgentSettings) -> list[Path]:
    """What the sandbox covers with an empty tmpfs: the agent's work dir (node key and
    certificate, default state file, every task's directory) and the state file's directory.
    Directories, not files: the agent replaces its state file by renaming a new one over it, which
    would uncover a bind mount made over the old file."""
    work = settings.work_dir.resolve()
    out = [work]
    state_dir = settings.effective_state_file.resolve().parent
    if not state_dir.is_relative_to(work):
        out.append(state_dir)
    return out


def nvidia_minors(proc: Path = Path("/proc/driver/nvidia/gpus")) -> dict[int, int]:
    """CUDA index (PCI bus order) -> the minor number of its /dev/nvidia<minor> node, from the
    driver's per-GPU information files (named by PCI address, so sorting them is bus order)."""
    out: dict[int, int] = {}
    try:
        gpus = sorted(proc.iterdir())
    except OSError:
        return out
    for index, gpu in enumerate(gpus):
        try:
            text = (gpu / "information").read_text()
        except OSError:
            continue
        m = re.search(r"^Device Minor:\s*(\d+)", text, re.MULTILINE)
        if m:
            out[index] = int(m.group(1))
    return out


def cuda_device_nodes(
    device_indices: tuple[int, ...], minors: Mapping[int, int], dev: Path = Path("/dev")
) -> list[Path]:
    """The /dev nodes the task's GPUs need: one per GPU and the driver's shared ones. The
    workers see CUDA devices in PCI bus order (CUDA_DEVICE_ORDER), the order ``minors`` is in."""
    own = [dev / f"nvidia{minors.get(i, i)}" for i in device_indices]
    return own + [dev / n for n in NVIDIA_SHARED]


def sandbox_command(
    cmd: list[str],
    *,
    writable: list[Path],
    readable: list[Path],
    device_kind: str,
    device_indices: tuple[int, ...],
    settings: AgentSettings,
    chdir: Path | None = None,
    as_root: bool | None = None,
    minors: Mapping[int, int] | None = None,
    nofile_hard: int | None = None,
) -> list[str]:
    """``cmd`` wrapped in ``prlimit`` and ``bwrap``. ``writable``: the task's own directories
    (its run dir, checkpoint dir, outputs); ``readable``: its staged inputs (code, venv, data),
    which may lie under the hidden work dir. Pure but for ``as_root`` (default: this process's
    euid), which only adds ``--cap-drop ALL`` for a root agent, and ``minors`` (default: read from the
    driver) for CUDA tasks."""
    if as_root is None:
        as_root = os.geteuid() == 0
    tmp_bytes = str(int(settings.task_tmp_gb * GIB))
    argv = task_limits(settings, len(device_indices), nofile_hard).argv()
    argv += [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--size", tmp_bytes, "--tmpfs", "/tmp", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
    if device_kind == "cuda":
        for node in cuda_device_nodes(device_indices, nvidia_minors() if minors is None else minors):
            argv += ["--dev-bind-try", str(node), str(node)]
        argv += ["--setenv", "CUDA_DEVICE_ORDER", "PCI_BUS_ID"]
    for d in hidden_dirs(settings):
        argv += ["--tmpfs", str(d)]
    # Later mounts go over earlier ones: the task's own paths reappear inside the hidden dirs.
    for p in _unique(p.resolve() for p in readable):
        argv += ["--ro-bind", str(p), str(p)]
    for p in _unique(p.resolve() for p in writable):
        argv += ["--bind", str(p), str(p)]
    for d in hidden_dirs(settings):  # the empty cover itself takes no writes (its binds still do)
        argv += ["--remount-ro", str(d)]
    argv += [
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",  # no nested user namespace: the kernel surface it opens stays closed
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        # Its workers die with bwrap's parent, the tree's keeper (``contracts.lifetime``), which
        # dies with the agent. No --new-session: the keeper starts the command in a process group
        # of its own in a session without a terminal (nothing to inject keystrokes into), and
        # keeping the sandbox's processes in that group lets the SIGTERM it forwards reach the
        # workers, not only bwrap.
        "--die-with-parent",
    ]
    if as_root:
        argv += ["--cap-drop", "ALL"]
    for name in HIDDEN_ENV:
        argv += ["--unsetenv", name]
    if chdir is not None:
        argv += ["--chdir", str(chdir.resolve())]
    return [*IGNORE_TERM, *argv, "--", sys.executable, "-c", DEFAULT_TERM, *cmd]


def secrets_of(settings: AgentSettings) -> list[Path]:
    """What no task may be given, nor a directory holding it: the node's key, certificate and
    state file, and the directory of every task's run."""
    work = settings.work_dir.resolve()
    return [
        work / "assignments",
        settings.node_key_file.resolve(),
        settings.node_cert_file.resolve(),
        settings.effective_state_file.resolve(),
    ]


def exposure_problems(paths: Iterable[Path], settings: AgentSettings) -> list[str]:
    """The paths that would show a sandboxed task what it must not see: each is the work dir's
    ``assignments`` dir, a secret, or a directory above one."""
    out = []
    for p in paths:
        p = p.resolve()
        hit = next((s for s in secrets_of(settings) if s == p or s.is_relative_to(p)), None)
        if hit is not None:
            out.append(f"{p} would expose {hit}")
    return out


def task_paths(
    config: Mapping[str, Any], run_dir: Path, cmd: list[str], env: Mapping[str, str]
) -> tuple[list[Path], list[Path]]:
    """(writable, readable) for a task's sandbox, from its worker config as the agent wrote it:
    writable its run dir, checkpoint dir and outputs dir; readable its data file, the entries
    of its PYTHONPATH (the staged code) and the venv its interpreter belongs to."""
    writable = [run_dir]
    ck = config.get("checkpoint")
    if isinstance(ck, dict) and isinstance(ck.get("dir"), str) and Path(ck["dir"]).is_absolute():
        writable.append(Path(ck["dir"]))
    if isinstance(config.get("outputs_dir"), str):
        writable.append(Path(config["outputs_dir"]))
    readable = []
    data = config.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str):
        readable.append(Path(data["path"]))
    readable += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cmd:
        venv = Path(cmd[0]).parent.parent
        if (venv / "pyvenv.cfg").is_file():
            readable.append(venv)
    return writable, [p for p in readable if p.is_absolute()]


def sandboxed(
    cmd: list[str],
    config: Mapping[str, Any],
    run_dir: Path,
    env: Mapping[str, str],
    *,
    device_kind: str,
    device_indices: tuple[int, ...],
    settings: AgentSettings,
) -> tuple[list[str], list[Path]]:
    """``cmd`` as a sandboxed task runs it, and the directories its disk quota covers; creates
    its writable directories (bwrap binds only what exists). InvalidArgument where a path of the
    config would expose the node's secrets or other tasks."""
    writable, readable = task_paths(config, run_dir, cmd, env)
    # A readable path above a hidden dir (the agent's own PYTHONPATH holding its work dir) shows
    # nothing the read-only root does not: left out, the dir stays hidden.
    hidden = hidden_dirs(settings)
    readable = [p for p in readable if not any(h.is_relative_to(p.resolve()) for h in hidden)]
    problems = exposure_problems([*writable, *readable], settings)
    if problems:
        raise InvalidArgument("the sandbox refuses this task's paths: " + "; ".join(problems))
    for p in writable:
        p.mkdir(parents=True, exist_ok=True)
    argv = sandbox_command(
        cmd,
        writable=writable,
        readable=[p for p in readable if p.exists()],
        device_kind=device_kind,
        device_indices=device_indices,
        settings=settings,
        chdir=run_dir,
    )
    return argv, writable


@dataclass(frozen=True)
class SandboxProbe:
    ok: bool
    reason: str  # why not, when not ok

    def capability(self, allow_unsandboxed: bool) -> str:
        """What the node registers: whether, and how, it runs user code."""
        if self.ok:
            return SANDBOX_BUBBLEWRAP
        return SANDBOX_UNSANDBOXED_ALLOWED if allow_unsandboxed else SANDBOX_NONE


def probe_sandbox(settings: AgentSettings, timeout_s: float = 30.0) -> SandboxProbe:
    """Run ``true`` inside the very sandbox a task gets (with the work dir as its writable dir):
    a node whose kernel forbids user namespaces, or without bwrap or prlimit, fails here, with the
    reason, rather than at its first user task."""
    for tool in (BWRAP, PRLIMIT):
        if shutil.which(tool) is None:
            return SandboxProbe(
                False, f"{tool} not found on PATH (Debian/Ubuntu: apt-get install bubblewrap)"
            )
    probe_dir = settings.work_dir.resolve() / "sandbox-probe"
    try:
        probe_dir.mkdir(parents=True, exist_ok=True)
        argv = sandbox_command(
            ["sh", "-c", "echo ok > probe && cat probe"],
            writable=[probe_dir],
            readable=[],
            device_kind="cpu",
            device_indices=(),
            settings=settings,
            chdir=probe_dir,
        )
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxProbe(False, f"bwrap could not run: {exc}")
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    if proc.returncode != 0 or proc.stdout.strip() != "ok":
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return SandboxProbe(False, f"bwrap failed: {why[:300]}")
    return SandboxProbe(True, "")


# -- the disk guard -------------------------------------------------------------------------------


def tree_bytes(paths: Iterable[Path]) -> int:
    """Bytes the files under ``paths`` take on disk (allocated blocks: sparse files count for what
    they hold). Symlinks are not followed; files that vanish while counted are skipped."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(p) for p in paths]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:  # hard links: one inode, counted once
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


def over_quota_reason(used: int, quota: int) -> str | None:
    if used <= quota:
        return None
    return (
        f"disk quota exceeded: the task's directories hold {used / GIB:.3f} GiB,"
        f" over its {quota / GIB:.3f} GiB (--task-disk-gb)"
    )


async def guard_disk(
    paths: list[Path],
    quota: int,
    on_exceed: Callable[[str], Any],
    interval_s: float,
) -> None:
    """Check the task's directories every ``interval_s`` until cancelled; on the first check over
    ``quota`` call ``on_exceed(reason)`` (which stops the task) and return."""
    while True:
        used = await asyncio.to_thread(tree_bytes, paths)
        reason = over_quota_reason(used, quota)
        if reason is not None:
            result = on_exceed(reason)
            if asyncio.iscoroutine(result):
                await result
            return
        await asyncio.sleep(interval_s)


def free_task_dirs(paths: Iterable[Path], keep: Iterable[str] = ()) -> None:
    """Delete what a task wrote in its directories (the directories stay, and the files named
    ``keep`` directly in them: the agent's own log and config)."""
    kept = set(keep)
    for top in paths:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if entry.name in kept and entry.is_file(follow_symlinks=False):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
