"""The node's worker profile: the real worker's start-up, teardown and reference training step.

At registration the agent launches ``training.reference_step`` exactly as it launches a job's
worker (torchrun, the worker environment, one process), so the figures are what a job pays here:
spawn to first step (interpreter, imports, rendezvous), the result to the process group gone, and
per precision the step split into FLOP rate and fixed costs. The host's real parallelism is
counted too: declared CPU slots beyond it share cores, and the planner prices them as shared.
On a GPU node the step runs on every device in turn, named by UUID, and the node registers the
slowest device's figures.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from agent.fetch import Cancelled
from agent.output import parse_prefixed
from agent.shared_profile import alike_key, load_shared, shared_path, store_shared
from contracts.lifetime import Watched, keeper_command
from contracts.metrics import RESULT_PREFIX
from contracts.registration import (
    COLLECTIVE_FIELDS,
    STEP_RATE_FIELDS,
    NodeProfile,
    StepRate,
    profile_problems,
)

log = logging.getLogger(__name__)

REFERENCE_TIMEOUT_S = 300.0
# How long an alike agent's figures stand for another agent of the host (``shared_profile``).
SHARED_MAX_AGE_S = 900.0
# Host-wide: every agent on the machine (any user, any work dir) sees the same file.
HOST_LOCK = Path(tempfile.gettempdir()) / "cpn-reference-step.lock"


def physical_cores() -> int:
    """CPUs this process may run on, capped by a cgroup CPU quota when one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def reference_env(base: dict[str, str], device_kind: str, device: str = "0") -> dict[str, str]:
    """The worker's environment (``agent.workers.worker_env``) for one device of this kind:
    ``device`` names the CUDA one (its UUID, as workers get theirs)."""
    env = dict(base, PYTHONUNBUFFERED="1", CPN_SPAWNED_AT=repr(time.time()))
    if device_kind == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = device
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@contextlib.contextmanager
def one_reference_at_a_time(
    lock_path: Path = HOST_LOCK, cancel: threading.Event | None = None
) -> Iterator[None]:
    """Agents of one host measure in turn. Measured together on shared cores, the reference's
    small fixed parts (per micro-batch, per step) came out up to 10x apart, and one of the demo's
    tiny steps is mostly those parts; the throughput figures agreed within 20 %. Raises
    ``Cancelled`` if ``cancel`` is set while waiting: a stopping agent must not start one later."""
    try:
        handle = open(lock_path, "a")  # noqa: SIM115 (closed below)
    except OSError as exc:  # another user's file: measure without taking turns
        log.info("reference step lock %s unavailable (%s): measuring at once", lock_path, exc)
        yield
        return
    with handle:
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    log.info("another agent on this host is measuring its reference step: waiting for it")
                    waited = True
                if cancel is None:
                    time.sleep(0.1)
                elif cancel.wait(0.1):
                    raise Cancelled("stopped while waiting for the host's reference step lock") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def another_measuring(lock_path: Path = HOST_LOCK) -> bool:
    """Whether an agent of this host is measuring its reference step now (it holds the host lock).
    Its start-up is a burst that goes when its turn ends, not load the host keeps: a contention
    probe beside it read 1.0-1.4 runnable threads a core on the benchmark's idle 2-core host,
    where the host alone read 0.5, and an agent that then ran jobs back to back kept that figure."""
    try:
        handle = open(lock_path, "a")  # noqa: SIM115 (closed below)
    except OSError:
        return False  # another user's file: nobody takes turns by it
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def measure_profile(
    device_kind: str,
    work_dir: Path,
    timeout_s: float = REFERENCE_TIMEOUT_S,
    then: Callable[[], object] | None = None,
    lock_path: Path = HOST_LOCK,
    device_model: str = "",
    shared_max_age_s: float = SHARED_MAX_AGE_S,
    cancel: threading.Event | None = None,
    cuda_devices: Sequence[str] = (),
) -> NodeProfile | None:
    """Run the reference worker once, after any other agent's on this host; None (with a warning)
    if it fails: the planner then prices this node with its defaults. An alike agent's figures
    from less than ``shared_max_age_s`` ago are taken instead of measuring (``shared_profile``;
    0: always measure). ``then`` runs after a measurement that succeeded (or was shared), still
    in this agent's turn: the host as the agent leaves it (its contention, ``contention.settle``)
    measured before the next agent's reference step starts. Settled after the turn, it measured
    that step too: an agent of the benchmark's shared host registered 1.22 runnable threads a
    core where the host idle read 0.5, and kept it while it ran jobs back to back, so every
    quote priced an extra thread there. ``cancel`` set (the agent is stopping): ``Cancelled``,
    with the reference step's whole tree ended."""
    shared = shared_path(lock_path)
    key = alike_key(device_kind, device_model, physical_cores())
    with one_reference_at_a_time(lock_path, cancel):
        profile = _shared_profile(shared, key, shared_max_age_s)
        if profile is None:
            profile = _measure_each(device_kind, work_dir, timeout_s, cancel, cuda_devices)
            if cancel is not None and cancel.is_set():
                raise Cancelled("stopped during the reference step")
            if profile is not None and shared_max_age_s > 0:
                store_shared(shared, key, profile)
        if profile is not None and then is not None:
            then()
        return profile


def slowest(profiles: Sequence[NodeProfile]) -> NodeProfile:
    """The node's profile from one per device: the slowest device's (lowest FLOP rate in its
    fastest precision). A quote prices every device of a group at one rate, and the group steps
    at its slowest member's pace."""
    return min(profiles, key=lambda p: max((r.tflops for r in p.rates), default=0.0))


def _measure_each(
    device_kind: str,
    work_dir: Path,
    timeout_s: float,
    cancel: threading.Event | None,
    cuda_devices: Sequence[str],
) -> NodeProfile | None:
    """The reference step on every CUDA device (``cuda_devices``, by UUID) one after another, not
    on whichever one CUDA numbers 0; one run for CPU slots. None when any device's run fails."""
    if device_kind != "cuda" or not cuda_devices:
        return _measure_profile(device_kind, work_dir, timeout_s, cancel)
    found = []
    for k, uuid in enumerate(cuda_devices):
        one = _measure_profile(device_kind, work_dir / f"device-{k}", timeout_s, cancel, device=uuid)
        if one is None or (cancel is not None and cancel.is_set()):
            return None
        rate = max((r.tflops for r in one.rates), default=0.0)
        log.info("reference step on device %d (%s): %.1f TFLOPS", k, uuid, rate)
        found.append(one)
    return slowest(found)


def _shared_profile(path: Path, key: str, max_age_s: float) -> NodeProfile | None:
    found = load_shared(path, key, max_age_s)
    if found is None:
        return None
    figures, age = found
    try:
        teardown, cores = float(figures["teardown_s"]), int(figures["physical_cores"])
    except (KeyError, TypeError, ValueError):
        return None
    profile = profile_from_result(figures, teardown_s=teardown, cores=cores)
    if profile is not None:
        log.info("reference step: taking the figures an alike agent of this host measured %.0f s ago", age)
    return profile


def _measure_profile(
    device_kind: str,
    work_dir: Path,
    timeout_s: float,
    cancel: threading.Event | None = None,
    device: str = "0",
) -> NodeProfile | None:
    work_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        "-m",
        "training.reference_step",
        "--device",
        device_kind,
    ]
    result, result_at = None, None
    env = reference_env(dict(os.environ), device_kind, device)
    # Under a keeper, as a job's workers run: torchrun's rank and the ranks it forks end with the
    # agent, and when it stops (no grace: a measurement has nothing to save).
    kept, fds = keeper_command(cmd, grace_s=0)
    with open(work_dir / "reference-step.log", "w") as logfile:
        proc = subprocess.Popen(
            kept, cwd=work_dir, env=env, stdout=subprocess.PIPE, stderr=logfile, text=True, pass_fds=fds
        )
        # A reference step that hangs is stopped as a whole after the timeout.
        watched = Watched(proc, time.monotonic() + timeout_s, cancel)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                logfile.write(line)
                if (payload := parse_prefixed(line.rstrip("\n"), RESULT_PREFIX)) is not None:
                    result, result_at = payload, time.monotonic()
        except BaseException:  # an error here: stop the tree all the same
            watched.stop()
            raise
        finally:
            watched.reap()  # the keeper exits once the tree is gone
    exited = time.monotonic()
    if proc.returncode != 0 or result is None or result_at is None:
        log.warning(
            "reference step failed (exit %s); see %s", proc.returncode, work_dir / "reference-step.log"
        )
        return None
    return profile_from_result(result, teardown_s=exited - result_at, cores=physical_cores())


def profile_from_result(result: dict[str, object], *, teardown_s: float, cores: int) -> NodeProfile | None:
    """The reference worker's result as a profile; None when it is malformed."""
    rates = result.get("rates")
    startup = result.get("startup_s")
    load = result.get("host_load_factor", 0.0)
    launcher = result.get("launcher_s", 0.0)
    # A reference worker that did not time a collective (CUDA, an older worker) reports none: 0.
    collective = {k: result.get(k, 0.0) for k in COLLECTIVE_FIELDS}
    numbers = all(isinstance(x, int | float) for x in (startup, load, launcher, *collective.values()))
    if not isinstance(rates, dict) or not numbers:
        return None
    try:
        profile = NodeProfile(
            startup_s=float(startup),
            teardown_s=teardown_s,
            physical_cores=cores,
            host_load_factor=float(load),
            launcher_s=float(launcher),
            **{k: float(v) for k, v in collective.items()},  # type: ignore[arg-type]
            rates=tuple(
                StepRate(precision=str(p), **{k: float(r[k]) for k in STEP_RATE_FIELDS})
                for p, r in sorted(rates.items())
                if isinstance(r, dict)
            ),
        )
    except (KeyError, TypeError, ValueError):
        return None
    problems = profile_problems(profile)
    if problems:
        log.warning("reference step result refused: %s", "; ".join(problems))
        return None
    return profile
