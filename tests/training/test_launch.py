"""``python -m training.launch``, the command every task starts with: torchrun whose ranks of
``training.worker`` fork from one process that imported the worker once. Real processes: the
ranks train as under torchrun, no rank is a fresh interpreter, a rank's exit status fails the
launch as it would under torchrun, and SIGTERM to the launcher ends every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from contracts.lifetime import descendants
from contracts.metrics import RESULT_PREFIX, parse_lines
from tests.processes import alive, marked_env, wait_until_gone
from tests.training.harness import REPO, tiny_config

LAUNCH = [sys.executable, "-m", "training.launch", "--standalone", "--nproc-per-node", "2"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _config(tmp: Path, name: str, **overrides: object) -> Path:
    path = tmp / name
    path.write_text(
        json.dumps(tiny_config(tmp, parallel={"dp_local": 2}, checkpoint={"dir": None}, **overrides))
    )
    return path


def test_ranks_fork_from_one_preloaded_worker_and_end_with_the_launcher(tmp_path: Path) -> None:
    env, mark = marked_env({**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    cfg = _config(
        tmp_path, "long.json", training={"steps": 100_000, "local_batch": 4, "lr": 3e-3, "warmup": 1}
    )
    proc = subprocess.Popen(
        [*LAUNCH, "-m", "training.worker", "--config", str(cfg)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the ranks are training
            if line.startswith("CPN_METRIC "):
                break
        tree = {pid: _cmdline(pid) for pid in descendants(proc.pid)}
        assert not [c for c in tree.values() if "-m training.worker" in c], tree  # no interpreter per rank
        (server,) = [
            p for p, c in tree.items() if "multiprocessing.forkserver" in c and _parent(p) == proc.pid
        ]
        assert "training.worker" in tree[server]  # preloaded there
        ranks = [p for p in tree if _parent(p) == server]
        assert len(ranks) == 2, tree
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        assert wait_until_gone(mark) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in alive(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_ranks_exit_status_fails_the_launch_as_under_torchrun(tmp_path: Path) -> None:
    # A TMPDIR deeper than a socket's path may be (a task's work directory): the fork server's
    # socket goes under a short system directory instead.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(deep)}
    ok = _config(tmp_path, "ok.json")
    done = subprocess.run(
        [*LAUNCH, "-m", "training.worker", "--config", str(ok)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(parse_lines(done.stdout, RESULT_PREFIX)) == 1  # the leader's
    assert [m["step"] for m in parse_lines(done.stdout)] == [1, 2, 3]
    pinned = _config(
        tmp_path, "pinned.json", data={"kind": "synthetic-markov", "seed": 3, "region": "cn-west"}
    )
    failed = subprocess.run(
        [*LAUNCH, "-m", "training.worker", "--config", str(pinned)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert failed.stderr.count("pinned to region 'cn-west'") == 2  # each rank said why
    assert "exitcode: 2" in failed.stderr  # the worker's own status, as torchrun reports it
