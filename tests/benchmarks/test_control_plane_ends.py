"""A benchmark stopped or killed leaves none of the processes it started: here
``benchmarks/control_plane.py`` in its first phase, stopped while its `cpn server` replica starts,
killed once the simulated agents' client processes stream heartbeats to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.bus import RedisBus, default_prefix
from orchestration.settings import Settings
from tests.conftest import REDIS_URL, _require, postgres_unreachable, redis_unreachable
from tests.dbtemplate import POSTGRES_ADMIN_URL, drop_postgres_database_later
from tests.processes import environ, marked_env, wait_for_process, wait_until_gone

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_benchmark_stopped_or_killed_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    _require(postgres_unreachable())
    _require(redis_unreachable())
    env, mark = marked_env(
        {**os.environ, "TMPDIR": str(tmp_path), "CPN_BENCH_POSTGRES_URL": POSTGRES_ADMIN_URL,
         "CPN_BENCH_REDIS_URL": REDIS_URL}
    )  # fmt: skip
    cmd = [sys.executable, "benchmarks/control_plane.py", "--quick", "--nodes", "4", "--client-procs", "2",
           "--no-chaos", "--no-stranded"]  # fmt: skip
    log = tmp_path / "bench.log"
    with open(log, "wb") as out:
        bench = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    database_url = ""
    try:
        (replica,) = wait_for_process(mark, "-m cpn server")
        database_url = environ(replica)["CPN_DATABASE_URL"]
        if sig == signal.SIGKILL:  # a point of its own: SIGTERM while the replica starts
            wait_for_process(mark, "spawn_main", count=2)  # the simulated agents' client processes
        bench.send_signal(sig)
        bench.wait(30)
        assert wait_until_gone(mark) == {}, log.read_text(errors="replace")[-3000:]
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        if database_url:  # what the benchmark would have dropped at its end
            bus = RedisBus(REDIS_URL, prefix=default_prefix(Settings(database_url=database_url)))
            bus.delete_prefixed()
            bus.close()
            drop_postgres_database_later(database_url)
