"""A user's code on the node: its archive unpacked once per digest, and a venv per requirements.

``<work_dir>/cache/code/<hex>/`` holds the unpacked archive (unpacked into a temporary directory,
then renamed: a directory under its final name is always whole). Nothing in an archive may land
outside its directory: absolute names, ``..``, links pointing out, device files and FIFOs are
refused, and the unpacked size is bounded.

``<work_dir>/cache/venvs/<hex>/`` (hex: the sha256 of ``requirements.txt``) is a venv over the
node's own packages (``--system-site-packages``: the node's torch is the one used; a constraints
file pins it so pip never replaces it). One build per requirements at a time (a lock file); a
venv is used only once its ``.complete`` marker is there.

Blocking code: the agent runs it in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import posixpath
import shutil
import site
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath

from agent.fetch import Cancelled
from contracts.artifacts import MAX_CODE_BYTES
from contracts.lifetime import Watched, keeper_command

MAX_UNPACKED_BYTES = 4 * MAX_CODE_BYTES
MAX_MEMBERS = 100_000
REQUIREMENTS = "requirements.txt"
VENV_DONE = ".complete"
PIP_TAIL_LINES = 20


class CodeError(Exception):
    """The code or its environment could not be prepared (the message says why)."""


@dataclass
class PipFailed(CodeError):
    message: str
    tail: list[str] = field(default_factory=list)  # pip's last lines

    def __str__(self) -> str:
        return self.message


def code_root(work_dir: Path) -> Path:
    return work_dir / "cache" / "code"


def venvs_root(work_dir: Path) -> Path:
    return work_dir / "cache" / "venvs"


def _member_problem(m: tarfile.TarInfo) -> str | None:
    """Why ``m`` may not be unpacked (None: it may)."""
    name = m.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or (parts and parts[0].endswith(":")):
        return "an absolute path"
    if ".." in parts:
        return "a '..' component"
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        return "a device file or FIFO"
    if m.issym() or m.islnk():
        target = m.linkname
        base = posixpath.dirname(name) if m.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"a link pointing outside the archive ({target!r})"
    return None


def check_archive(tar: tarfile.TarFile, max_bytes: int = MAX_UNPACKED_BYTES) -> list[tarfile.TarInfo]:
    """Every member, once all are known to be safe; CodeError naming the first that is not."""
    members, total = [], 0
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise CodeError(f"code archive: more than {MAX_MEMBERS} entries")
        if problem := _member_problem(m):
            raise CodeError(f"code archive: refused {m.name[:200]!r}: {problem}")
        total += max(0, m.size) if m.isfile() else 0
        if total > max_bytes:
            raise CodeError(f"code archive: unpacks to more than {max_bytes} bytes")
        members.append(m)
    return members


def unpack_code(archive: Path, digest: str, work_dir: Path) -> tuple[Path, bool]:
    """The archive unpacked under the code cache: (its directory, whether it was there already)."""
    root = code_root(work_dir)
    final = root / digest.removeprefix("sha256:")
    if final.is_dir():
        os.utime(final)
        return final, True
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{final.name[:16]}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = check_archive(tar)
                # The 'data' filter refuses the same things again, and drops modes it should not keep.
                tar.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CodeError(f"code archive: cannot be unpacked: {exc}") from None
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not another task's rename that won
                raise
        return final, False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def requirements_digest(code_dir: Path) -> str | None:
    path = code_dir / REQUIREMENTS
    if not path.is_file():
        return None
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def torch_constraint() -> str:
    """A constraints line pinning the node's torch, so no requirement can replace it."""
    try:
        return f"torch=={metadata.version('torch')}\n"
    except metadata.PackageNotFoundError:
        return ""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@dataclass(frozen=True)
class Venv:
    path: Path
    cache_hit: bool  # it was there already
    cpu_s: float = 0.0  # CPU seconds its build took (0 for a cache hit): the build per idle core


def ensure_venv(
    code_dir: Path,
    digest: str,
    work_dir: Path,
    *,
    pip_args: Sequence[str] = (),
    timeout_s: float = 1800.0,
    on_line: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> Venv:
    """The venv for the archive's requirements, built where it is not there already. The
    archive's requirements.txt must hash to ``digest``. PipFailed holds pip's last lines."""
    got = requirements_digest(code_dir)
    if got is None:
        raise CodeError(f"stage.requirements_digest is set but the code archive has no {REQUIREMENTS}")
    if got != digest:
        raise CodeError(f"{REQUIREMENTS} hashes to {got}, not stage.requirements_digest {digest}")
    root = venvs_root(work_dir)
    root.mkdir(parents=True, exist_ok=True)
    venv = root / digest.removeprefix("sha256:")
    with open(root / f"{venv.name}.lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second task with the same requirements waits here
        if (venv / VENV_DONE).exists():
            os.utime(venv)
            return Venv(venv, True)
        shutil.rmtree(venv, ignore_errors=True)  # a build that was interrupted
        try:
            cpu_s = build(venv, code_dir / REQUIREMENTS, pip_args, timeout_s, on_line, cancel)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / VENV_DONE).write_text(digest)
    return Venv(venv, False, cpu_s)


def measure_build(work_dir: Path, *, pip_args: Sequence[str] = (), timeout_s: float = 300.0) -> float:
    """CPU seconds of one venv build as a task's (``build``) with nothing to install: python's
    venv, then pip's start-up and its look at the node's packages, the fixed part of every build
    (pip read "numpy>=1.24", already on the node, in as much CPU time as nothing on the benchmark
    host). A build's downloads and installs come on top and are not in it."""
    root = venvs_root(work_dir)
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f".probe-{uuid.uuid4().hex[:8]}"  # never a requirements digest's name
    try:
        scratch.mkdir()
        requirements = scratch / REQUIREMENTS
        requirements.write_text("# the staging probe: nothing to install\n")
        return build(scratch / "venv", requirements, pip_args, timeout_s, None, None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def complete_venvs(work_dir: Path) -> list[tuple[float, str]]:
    """(last use, sha256:<hex> of its requirements) of every complete venv in the cache."""
    root = venvs_root(work_dir)
    out = []
    for marker in root.glob(f"*/{VENV_DONE}") if root.is_dir() else ():
        name = marker.parent.name
        if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
            out.append((marker.parent.stat().st_mtime, "sha256:" + name))
    return out


def build(
    venv: Path,
    requirements: Path,
    pip_args: Sequence[str],
    timeout_s: float,
    on_line: Callable[[str], None] | None,
    cancel: threading.Event | None,
) -> float:
    """Build ``venv`` with ``requirements`` installed; the CPU seconds it took (both commands and
    their children)."""
    # No pip of its own: the node's pip (a system site-package) installs into the venv.
    cpu_s = _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        "python -m venv",
        timeout_s,
        None,
        cancel,
    )
    _see_node_packages(venv)
    constraints = venv / "constraints.txt"
    constraints.write_text(torch_constraint())
    cmd = [
        str(venv_python(venv)),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "-c",
        str(constraints),
        *pip_args,
        "-r",
        str(requirements),
    ]
    return cpu_s + _run(cmd, "pip install", timeout_s, on_line, cancel)


def _see_node_packages(venv: Path) -> None:
    """Where the agent itself runs in a venv, ``--system-site-packages`` reaches only the base
    interpreter's packages: a .pth file adds the agent's own site dirs (torch, cpn) after the
    venv's, so the node's packages are the ones used either way."""
    if sys.prefix == sys.base_prefix:
        return
    found = list(venv.glob("lib/python*/site-packages"))
    if not found:
        return
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    found[0].joinpath("_cpn_node.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    )


def _run(
    cmd: list[str],
    what: str,
    timeout_s: float,
    on_line: Callable[[str], None] | None,
    cancel: threading.Event | None,
) -> float:
    """Run ``cmd``, its output to ``on_line``; the CPU seconds it and its children used."""
    tail: deque[str] = deque(maxlen=PIP_TAIL_LINES)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PIP_NO_INPUT": "1"}
    deadline = time.monotonic() + timeout_s
    # Under a keeper: pip's build processes end with it, when it is stopped and with the agent.
    kept, fds = keeper_command(cmd, grace_s=0)
    proc = subprocess.Popen(
        kept,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
        pass_fds=fds,
    )
    assert proc.stdout is not None
    # The keeper ends pip's whole tree when stopped; its CPU time is read at its reaping.
    watched = Watched(proc, deadline, cancel)
    try:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line[:500])
            if on_line is not None and line.strip():
                on_line(line[:2000])
    except BaseException:  # an error here ends the build all the same
        watched.stop()
        watched.reap()
        raise
    code, cpu_s = watched.reap()
    if code == 0:
        return cpu_s
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{what}: stopped")
    if time.monotonic() > deadline:
        raise PipFailed(f"{what}: still running after {timeout_s:g}s; stopped", list(tail))
    lines = [t for t in tail if t.strip()]
    raise PipFailed(f"{what} failed (exit code {code}): " + " | ".join(lines[-6:]), lines)
