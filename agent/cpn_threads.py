"""The runnable threads of cpn's own processes on this machine, read from /proc.

The contention probe (``agent.contention``) counts every runnable thread on the host, and a quote
adds cpn's own work there itself (the plan's slots and the slots other jobs hold now). So the
figure an agent sends leaves out cpn's processes: every agent on the machine (``python -m agent``,
``cpn agent``), whatever they started (keepers, launchers, fork servers, ranks, reference steps,
user code inside a task), and task processes whatever started them (a Slurm step's
``training.launch``). Without that, a figure taken beside a co-located agent's job counted its
workers, and the control plane could only subtract the slots it knew held, which is too much
while those workers start, wait or exit (it priced the host's other tenants as none).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")
# ``-m`` modules and script paths that make a process cpn's, and everything below it.
MODULES = ("agent", "training.launch", "training.worker", "training.reference_step")
SCRIPTS = ("agent/__main__.py", "training/launch.py", "training/worker.py", "training/reference_step.py")
MAX_DEPTH = 64  # ancestors followed (a cycle cannot occur, a torn read might)


def is_cpn_command(argv: list[str]) -> bool:
    """Whether a command line is one of cpn's own: an agent or a task's launcher or worker (a
    module run with ``-m`` among the interpreter's first options, or a script of cpn's)."""
    for i, arg in enumerate(argv[1:4], start=1):
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in MODULES
        if not arg.startswith("-"):  # the script, or the ``cpn`` command's first argument
            return (
                arg.endswith(SCRIPTS)
                or (arg == "agent" and os.path.basename(argv[i - 1]) == "cpn")
                or (os.path.basename(arg) == "cpn" and argv[i + 1 : i + 2] == ["agent"])
            )
    return False


def _stat(pid: str) -> tuple[str, int, int, str] | None:
    """(state, parent pid, thread count, start time) of a process; None where it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # after the command: state(3) ppid(4) ... num_threads(20) ... starttime(22)
    return fields[0], int(fields[1]), int(fields[17]), fields[19]


def _runnable_threads(pid: str, skip_tid: int) -> int:
    count = 0
    try:
        tasks = list((PROC / pid / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        if int(task.name) == skip_tid:
            continue
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        count += state == "R"
    return count


class CpnThreads:
    """Counts cpn's runnable threads; remembers which processes are cpn's by (pid, start time)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], bool] = {}

    def _own_command(self, pid: int, started: str) -> bool:
        key = (pid, started)
        if key not in self._known:
            try:
                raw = (PROC / str(pid) / "cmdline").read_bytes()
            except OSError:
                raw = b""
            self._known[key] = is_cpn_command([a.decode(errors="replace") for a in raw.split(b"\0") if a])
        return self._known[key]

    def own_pids(self) -> tuple[set[int], dict[int, tuple[str, int, int, str]]] | None:
        """The pids of cpn's processes (each a cpn command or below one) and every process's
        stat; None where /proc cannot be read."""
        try:
            pids = [p for p in os.listdir(PROC) if p.isdigit()]
        except OSError:
            return None
        stats = {int(p): s for p in pids if (s := _stat(p)) is not None}
        if not stats:
            return None
        own: dict[int, bool] = {}
        for pid in stats:
            chain, verdict, at = [], False, pid
            while len(chain) < MAX_DEPTH:
                if at in own:
                    verdict = own[at]
                    break
                if at not in stats:
                    break
                chain.append(at)
                if self._own_command(at, stats[at][3]):
                    verdict = True
                    break
                at = stats[at][1]
            for p in chain:
                own[p] = verdict
        self._known = {k: v for k, v in self._known.items() if k[0] in stats}
        return {p for p, v in own.items() if v}, stats

    def runnable(self) -> int | None:
        """Runnable threads of cpn's processes now, the calling thread left out; None where /proc
        cannot be read."""
        found = self.own_pids()
        if found is None:
            return None
        pids, stats = found
        skip = threading.get_native_id()
        total = 0
        for pid in pids:
            state, _, threads, _ = stats[pid]
            if threads == 1:
                total += state == "R" and pid != skip
            else:
                total += _runnable_threads(str(pid), skip)
        return total
