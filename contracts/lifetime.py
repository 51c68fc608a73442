"""Child processes that end with their parent, whatever ends the parent (SIGKILL included).

Two ways, one for each kind of child:

- **Our own programs** (``cpn agent``, a worker of ``cpn server --workers``, a benchmark's helper
  process) tie themselves. The parent starts them with ``tied_env()`` (its pid in
  ``CPN_DIE_WITH_PARENT``) and they call ``die_with_parent()`` first thing: the kernel then sends
  them SIGKILL when the parent goes (``PR_SET_PDEATHSIG``), and they exit at once if it went
  before they asked. The kernel sends it when the *thread* that started the child ends, so such
  children are started from a thread that lives as long as the parent (its main thread).
- **Trees we do not control** run under a keeper: this file run as a script (``keeper_command``).
  torchrun starts its ranks in sessions of their own, so neither a signal to its process group nor
  its death reaches them; pip starts build processes; the reference step forks probe ranks. The
  keeper is a subreaper between the parent and the tree: every orphan of the tree comes back to
  it, so it can always end all of it. It ends the tree (SIGKILL to every process under it, until
  none is left) when the parent dies (EOF on a pipe only the parent process holds open: whichever
  thread started the keeper, and even if the parent died before the keeper ran), when SIGTERM,
  SIGINT or SIGHUP sent to it has been forwarded to the child's process group and ``grace_s`` has
  passed, and when the child exits (whatever it left behind). It then exits as its child did
  (the same code, or killed by the same signal).

Signal the keeper, never its child's process group: the keeper forwards what it gets, so the
child would get it twice. The keeper starts its own session, so a terminal's Ctrl-C reaches the
parent alone, which decides. Linux only (prctl, /proc). This file imports only the standard
library: the keeper runs it as a script with ``python -I -S``, where nothing else is importable,
and neither the job's ``PYTHONPATH`` nor its working directory can put code into it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import subprocess

PARENT_ENV = "CPN_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Python ignores these; a child should start with the default, as subprocess gives it.
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)

_lifeline_lock = threading.Lock()
_lifeline: tuple[int, int, int] | None = None  # (pid, read end, write end)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# -- the parent's side ------------------------------------------------------------------------


def tied_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a child that calls ``die_with_parent()``."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def lifeline() -> int:
    """The read end of a pipe whose write end only this process holds (never written, never
    closed): it reads EOF once the process is gone, however it went."""
    global _lifeline
    with _lifeline_lock:
        if _lifeline is None or _lifeline[0] != os.getpid():  # a forked child makes its own
            read, write = os.pipe()  # both non-inheritable: no other child holds the write end
            _lifeline = (os.getpid(), read, write)
        return _lifeline[1]


def keeper_command(cmd: Sequence[str], *, grace_s: float) -> tuple[list[str], tuple[int, ...]]:
    """``cmd`` under a keeper: the argv to start, and the fds to pass it (``pass_fds``).
    ``grace_s``: from the first SIGTERM, SIGINT or SIGHUP to SIGKILL for the whole tree."""
    fd = lifeline()
    argv = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(fd), repr(float(grace_s))]
    return [*argv, "--", *cmd], (fd,)


class Watched:
    """A keeper (``keeper_command``) whose reads block the thread that started it: a watcher
    thread SIGTERMs it (the keeper ends its tree) once ``deadline`` (monotonic) has passed or
    ``cancel`` is set, and ``reap`` gives its exit code and the CPU seconds of it and the children
    it waited for. The watcher never reaps: an exited keeper stays a zombie until ``reap``, so no
    signal can reach another process that took its pid, and its CPU time is still there to read."""

    def __init__(
        self, proc: subprocess.Popen[Any], deadline: float, cancel: threading.Event | None = None
    ) -> None:
        self.proc, self._deadline, self._cancel = proc, deadline, cancel
        self._exited, self._guard = threading.Event(), threading.Lock()
        self._reaped: tuple[int, float] | None = None
        self._thread = threading.Thread(target=self._watch, name="cpn-watched", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._exited.wait(0.1):
            if time.monotonic() > self._deadline or (self._cancel is not None and self._cancel.is_set()):
                self.stop()
                return

    def stop(self) -> None:
        """SIGTERM the keeper, unless it has exited (it then ends its tree, with its grace)."""
        with self._guard:
            if not self._exited.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGTERM)

    def reap(self) -> tuple[int, float]:
        """Wait for the keeper's exit: (exit code, CPU seconds from the kernel's accounting)."""
        if self._reaped is None:
            try:
                os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
                with self._guard:
                    self._exited.set()
                _, status, usage = os.wait4(self.proc.pid, 0)
            except ChildProcessError:  # reaped elsewhere: its status is Popen's, its CPU time unknown
                self._exited.set()
                self._reaped = (self.proc.wait(), 0.0)
            else:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self._reaped = (self.proc.returncode, usage.ru_utime + usage.ru_stime)
            self._thread.join()
        return self._reaped


# -- the child's side -------------------------------------------------------------------------


def die_with_parent(parent: int | None = None) -> None:
    """Ask for SIGKILL when ``parent`` dies (default: the pid a parent put in ``PARENT_ENV``;
    without one, do nothing). Exits at once if the parent is already gone, or is not this
    process's parent: a child tied through a wrapper that forks it would die with the wrapper."""
    if parent is None:
        value = os.environ.pop(PARENT_ENV, "")  # not passed on: our own children are not its
        if not value.isdigit():
            return
        parent = int(value)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request: no signal will come
        os._exit(1)


# -- process trees ----------------------------------------------------------------------------


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, ())
    return found


def kill_tree(root: int, *, include_root: bool = True) -> None:
    """SIGKILL ``root``'s descendants, then ``root``: a fallback where a keeper did not end its
    own tree. Not watertight from outside (an orphan made meanwhile goes to init); the keeper,
    a subreaper, is."""
    for pid in [*descendants(root), *([root] if include_root else [])]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# -- the keeper -------------------------------------------------------------------------------


class _Keeper:
    def __init__(self, lifeline_fd: int, grace_s: float) -> None:
        self.lifeline = lifeline_fd
        self.grace_s = grace_s
        self.child = 0
        self.status: int | None = None  # the child's wait status, once reaped
        self.asked: list[int] = []  # signals received, not forwarded yet

    def reap(self) -> bool:
        """Collect every child that has ended; False once none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child:
                self.status = status

    def end_tree(self) -> None:
        """SIGKILL every process under the keeper until none is left. Orphans of the tree come
        back to the keeper (a subreaper), so a process forked meanwhile is found next round."""
        while True:
            kill_tree(os.getpid(), include_root=False)
            if not self.reap():
                return
            time.sleep(0.01)

    def run(self, cmd: list[str]) -> NoReturn:
        with contextlib.suppress(PermissionError):  # already a session leader: start_new_session
            os.setsid()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        os.set_inheritable(self.lifeline, False)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in FORWARDED:
            signal.signal(sig, lambda signum, _frame: self.asked.append(signum))
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # wakes the select below
        try:
            # Its own process group: the keeper signals it (and what it started there) apart.
            self.child = os.posix_spawnp(cmd[0], cmd, os.environ, setpgroup=0, setsigdef=RESTORED)
        except OSError as exc:
            print(f"cpn keeper: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
            os._exit(127)
        deadline: float | None = None
        while True:
            while self.asked:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.child, self.asked.pop(0))
                if deadline is None:
                    deadline = time.monotonic() + self.grace_s
            if deadline is not None and time.monotonic() >= deadline:
                self.end_tree()
            self.reap()
            if self.status is not None:
                break
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.lifeline, wake_r], [], [], timeout)
            if wake_r in readable:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            if self.lifeline in readable and not os.read(self.lifeline, 512):
                self.end_tree()  # the parent is gone: so is everything it started here
                os._exit(1)
        self.end_tree()  # whatever the child left behind
        _exit_as(self.status)


def _exit_as(status: int) -> NoReturn:
    """Exit as a child with wait status ``status`` did: its code, or its death by a signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        signal.set_wakeup_fd(-1)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to end the process
    os._exit(os.waitstatus_to_exitcode(status))


def _main(argv: list[str]) -> NoReturn:
    """``lifetime.py LIFELINE_FD GRACE_S -- CMD...``"""
    if len(argv) < 4 or argv[2] != "--":
        print("usage: lifetime.py LIFELINE_FD GRACE_S -- CMD...", file=sys.stderr)
        os._exit(2)
    _Keeper(int(argv[0]), float(argv[1])).run(argv[3:])


if __name__ == "__main__":
    _main(sys.argv[1:])
