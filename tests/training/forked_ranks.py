"""Rank processes for the tests' own launches (``harness.launch``, ``sync_launch.start_region``),
forked from one interpreter per test process that imported ``training.worker`` once, as
``training.launch`` forks the agent's ranks. Each is a real process of its own that runs the
module (``-m``) or script the test names as ``__main__``, with the rank's environment, working
directory and output file; only the imports are shared. A fresh interpreter per rank spent about
2-3 CPU-seconds importing torch and the trainer: most of a short test's cost on a 2-core host."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import threading
from multiprocessing import forkserver
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
_PRELOAD = ["training.worker"]
_started = threading.Lock()


def _server() -> None:
    """The fork server, once per test process, started with the ranks' one thread per process in
    its environment (torch sizes its thread pools from it)."""
    with _started:
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            _CONTEXT.set_forkserver_preload(_PRELOAD)
            forkserver.ensure_running()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved


def _run(argv: list[str], env: dict[str, str], output: str, cwd: str) -> None:
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


class Rank:
    """One rank's process, as ``subprocess.Popen`` would be used: ``pid``, ``poll``, ``wait``,
    ``kill``, ``returncode`` (negative: the signal that ended it); its output in ``output``."""

    def __init__(self, argv: list[str], env: dict[str, str], output: Path, cwd: Path) -> None:
        _server()
        self.argv, self.output = argv, output
        self._process = _CONTEXT.Process(target=_run, args=(argv, env, str(output), str(cwd)))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
        return self._process.exitcode

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()
