"""The NCCL environment a node's CUDA workers run with, from the agent's settings, and what a
worker's output says when a collective failed.

The provider knows its fabric: which interface carries the bootstrap and socket traffic
(``NCCL_SOCKET_IFNAME``; the same for gloo) and which InfiniBand HCAs and ports NCCL may use
(``NCCL_IB_HCA``). Timeouts: the process group's (``CPN_PG_TIMEOUT_S``, read by
``training.parallel.init``) and PyTorch's watchdog, which aborts a rank whose collective ran past
it (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), so a dead peer ends the task instead of hanging it, and
dumps the collectives in flight (the flight recorder) beside the worker's log. NCCL's own log goes
to files in the task's run dir (``NCCL_DEBUG_FILE``): the task log gets them only when a
collective failed, not every INFO line of every healthy run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from contracts.worker_config import PG_TIMEOUT_ENV

# NCCL's list syntax: an optional ^ (exclude) or = (exact names), then comma-separated prefixes;
# IB HCAs may name a port (mlx5_0:1).
IFNAME_RE = re.compile(r"[\^=]?[A-Za-z0-9_.\-]{1,32}(,[A-Za-z0-9_.\-]{1,32}){0,31}")
IB_HCA_RE = re.compile(r"[\^=]?[A-Za-z0-9_]{1,32}(:\d{1,2})?(,[A-Za-z0-9_]{1,32}(:\d{1,2})?){0,31}")
DEBUG_LEVELS = ("", "WARN", "INFO")
DEBUG_GLOB = "nccl-debug.*.log"
TRACE_PREFIX = "nccl-trace-rank-"
WATCHDOG_SLACK_S = 60.0  # the watchdog's own heartbeat beyond the collective timeout


def nccl_env(
    run_dir: Path, *, socket_ifname: str, ib_hca: str, timeout_s: float, debug: str
) -> dict[str, str]:
    """The variables a task's workers get (settings validated by ``agent.settings``)."""
    env = {
        PG_TIMEOUT_ENV: f"{timeout_s:g}",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a timed-out collective aborts its rank
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": f"{int(timeout_s + WATCHDOG_SLACK_S)}",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(run_dir / TRACE_PREFIX),
    }
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = socket_ifname
    if ib_hca:
        env["NCCL_IB_HCA"] = ib_hca
    if debug:
        env["NCCL_DEBUG"] = debug
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET" if debug == "INFO" else "ALL"
        env["NCCL_DEBUG_FILE"] = str(run_dir / "nccl-debug.%h.%p.log")  # host, pid
    return env


_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r".*?Timeout\(ms\)=(?P<ms>\d+)"
)
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation")
_NCCL_ERROR = re.compile(
    r"(ncclSystemError|ncclRemoteError|ncclInternalError|ncclUnhandledCudaError|NCCL error)"
)


def collective_failure(lines: Iterable[str]) -> str:
    """A clear reason for a task whose workers' output shows a failed collective; "" if none does."""
    for line in lines:
        if m := _TIMEOUT.search(line):
            return (
                f"NCCL collective timed out: {m['op']} (sequence {m['seq']}) waited "
                f"{int(m['ms']) / 1000:g} s for a peer; a rank stopped or the network between ranks"
                " failed (NCCL's log is in the task's log)"
            )
        if m := _GLOO_TIMEOUT.search(line):
            return (
                f"collective timed out: a {m['op']} waited {int(m['ms']) / 1000:g} s for a peer;"
                " a rank stopped or the network between ranks failed"
            )
    for line in lines:
        if m := _NCCL_ERROR.search(line):
            return f"NCCL failed ({m[1]}): {line.strip()[:300]} (NCCL's log is in the task's log)"
    return ""


def is_collective_line(line: str) -> bool:
    """Whether a worker's stderr line may say how a collective failed (kept apart from the tail)."""
    return bool(_TIMEOUT.search(line) or _GLOO_TIMEOUT.search(line) or _NCCL_ERROR.search(line))


def debug_tail(run_dir: Path, lines_per_file: int = 40, max_files: int = 16) -> list[str]:
    """The last lines of each NCCL debug file in the run dir, headed by its name, and the
    flight-recorder dumps by name (they are pickles, for ``torchfrtrace``): what the agent adds to
    the task's log after a collective failed."""
    out: list[str] = []
    for path in sorted(run_dir.glob(DEBUG_GLOB))[:max_files]:
        try:
            text = path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        except OSError:
            continue
        out.append(f"[cpn-agent] --- {path.name} (last {lines_per_file} lines) ---")
        out.extend(text.splitlines()[-lines_per_file:])
    for path in sorted(run_dir.glob(TRACE_PREFIX + "*"))[:max_files]:
        out.append(f"[cpn-agent] collectives in flight at the timeout: {path} (read it with torchfrtrace)")
    return out
