"""The reference worker's start-up per idle core: CPU time of the launcher and the worker, not wall."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from training.reference_step import launcher_cpu_s, startup_per_idle_core
from training.worker import process_started_at

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass\n"


def test_launcher_cpu_is_read_from_proc_for_a_real_process() -> None:
    if sys.platform != "linux":
        pytest.skip("/proc is Linux's")
    code = BURN + "print(time.process_time(), flush=True)\ninput()\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        own = float(proc.stdout.readline())
        seen = launcher_cpu_s(proc.pid)
        assert seen is not None
        # Clock ticks are 10 ms; the process has been idle since it printed its own figure.
        assert own - 0.03 <= seen <= own + 0.1
    finally:
        proc.communicate("\n", timeout=10)


def test_a_process_that_is_gone_has_no_figure() -> None:
    proc = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert proc.returncode == 0
    assert launcher_cpu_s(2**22 + 12345) is None  # above Linux's default pid_max


def test_start_up_is_the_cpu_spent_but_never_more_than_the_wall() -> None:
    # Crowded host: 11.6 s of wall for 2.9 s of CPU (figures of three agents registering at once).
    assert startup_per_idle_core(11.6, 1.7, 1.2) == pytest.approx(2.9)
    # Waiting that is not CPU (an idle host's disk) cannot make it exceed what was seen.
    assert startup_per_idle_core(2.0, 1.5, 1.2) == 2.0
    # No launcher figure (not Linux): the wall time, as before.
    assert startup_per_idle_core(5.0, 1.0, None) == 5.0


def test_a_worker_knows_when_its_process_started() -> None:
    # The launcher's part of a job's start-up ends when the worker process starts.
    if sys.platform != "linux":
        pytest.skip("/proc is Linux's")
    code = "import time\nfrom training.worker import process_started_at as at\nprint(at(), time.time())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    started, now = (float(x) for x in out.split())
    # Clock ticks are 10 ms; the interpreter's own imports come after its start.
    assert before - 0.03 <= started <= now + 0.03
    assert process_started_at() is not None and process_started_at() <= time.time()  # type: ignore[operator]
