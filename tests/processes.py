"""The processes of one run, wherever they went: found by a mark in their environment.

Every process a test starts inherits its environment, and so does everything those start (torchrun
passes it to its ranks, the agent to its workers and keepers), in whatever session or process
group they run and whoever their parent is now. ``/proc/<pid>/environ`` keeps the environment a
process started with, so a process that removes the mark from its own still carries it there.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from pathlib import Path

MARK_ENV = "TEST_RUN_MARK"  # not CPN_*: benchmarks/control_plane.py keeps those from its replicas


def marked_env(base: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """``base`` (default: this process's environment) with a fresh mark; and the mark."""
    mark = secrets.token_hex(8)
    return {**(os.environ if base is None else base), MARK_ENV: mark}, mark


def alive(mark: str) -> dict[int, str]:
    """Live processes carrying ``mark`` (zombies are not counted: they are gone but for their
    exit status, which a parent, or init, has not collected yet), with their command lines."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(proc.name)] = (
                (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if p)


def wait_until_gone(mark: str, timeout_s: float = 60.0) -> dict[int, str]:
    """Wait (up to a generous ceiling) until no process carries ``mark``; return the survivors."""
    deadline = time.monotonic() + timeout_s
    while (left := alive(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def wait_for_process(mark: str, needle: str, timeout_s: float = 120.0, count: int = 1) -> list[int]:
    """Wait until ``count`` processes carrying ``mark`` have ``needle`` in their command line."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [pid for pid, cmd in alive(mark).items() if needle in cmd]
        if len(pids) >= count:
            return pids
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} process(es) running {needle!r}: only {pids}; marked: {alive(mark)}")
        time.sleep(0.1)


# Ports a test hands to a process it starts (a rendezvous, a sync server) come from here: below the
# kernel's ephemeral range, one block per xdist worker. A port bound to 0 and closed again is free
# for any other process's next bind to 0 or outgoing connection until the test's process binds it,
# and with a few workers starting servers all the time one did take such a port in between (a
# group's node then waited out its rendezvous).
PORT_POOL = range(10000, 19600)
POOL_BLOCKS = 8
_cursor: dict[int, int] = {}


def _binds(port: int) -> bool:
    """Whether ``port`` binds on loopback now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pool_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...; unset without xdist
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = len(PORT_POOL) // POOL_BLOCKS
    start = PORT_POOL.start + (index % POOL_BLOCKS) * size
    return range(start, start + size)


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports of this worker's block that bind now, none of the ones handed
    out just before (a test's processes may not have bound theirs yet). Two runs of the suite at
    once start at different points of their blocks."""
    block = _pool_block()
    at = _cursor.setdefault(block.start, os.getpid() * 7919 % len(block))
    found = ports_in([*block[at:], *block[:at]], n)
    _cursor[block.start] = (block.index(found[-1]) + 1) % len(block)
    return found


def free_port() -> int:
    """One port of ``free_ports``."""
    return free_ports(1)[0]


def ports_in(block: Sequence[int], n: int) -> list[int]:
    """``n`` ports of ``block`` that bind on loopback now. A server restarted on its ports takes
    them from a block below the kernel's ephemeral range (32768 up on Linux): there no other
    test's outgoing connection can take one while the server is down."""
    found = []
    for port in block:
        if not _binds(port):
            continue
        found.append(port)
        if len(found) == n:
            return found
    raise AssertionError(f"fewer than {n} free ports among {len(block)} from {block[0]}")
