"""The control plane's word that a peer is lost reaches a region's sync loop through the notices
file the agent appends to. A frozen peer (SIGSTOP: its kernel still accepts connections, nothing
answers, as in a partition) is dropped at the notice, not at the sync timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from contracts.lost_notices import LostNotice, NoticeReader, append_notice
from contracts.sync_config import SyncConfig
from tests.training.test_sync_engine import train
from training.sync.engine import SyncEngine, create_engine

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 25.0  # what a survivor would wait for a silent peer without the notice


def test_reader_takes_each_complete_line_once(tmp_path: Path) -> None:
    path = tmp_path / "lost.jsonl"
    reader = NoticeReader(path)
    assert reader.new() == []  # no file yet
    append_notice(path, LostNotice("eu-west", "10.0.0.1:5000", "missed 3 heartbeats"))
    with open(path, "a") as f:
        f.write("not json\n")  # damaged: skipped
        f.write('{"participant": "us-east", "address": "x:1"')  # being written: not yet
    assert reader.new() == [LostNotice("eu-west", "10.0.0.1:5000", "missed 3 heartbeats")]
    assert reader.new() == []
    with open(path, "a") as f:
        f.write(', "reason": "r"}\n')
    assert reader.new() == [LostNotice("us-east", "x:1", "r")]


def _engine(r: str, rdv: Path, steps: int, notices: Path | None) -> SyncEngine:
    cfg = SyncConfig(
        peers=dict.fromkeys(["a", "b", "c"], ""),
        rendezvous_dir=str(rdv),
        timeout_s=TIMEOUT_S,
        startup_timeout_s=60,
        mode="diloco",
        every=5,
        overlap=False,  # blocking rounds on the fixed schedule: a frozen peer stalls the next one
        land_on_arrival=False,
        lost_notices=str(notices) if notices else None,
    )
    return create_engine(cfg, region=r, total_steps=steps, weight=1 / 3, theta0=torch.zeros(3))


FROZEN = """
import sys, time
sys.path.insert(0, {repo!r})
from tests.training.test_lost_notices import _engine
from tests.training.test_sync_engine import train
from pathlib import Path
eng = _engine("c", Path({rdv!r}), {steps}, None)
train(eng, "c", {steps}, [], dt=0.03)
"""


def test_a_frozen_peer_is_dropped_at_the_notice_not_the_timeout(tmp_path: Path) -> None:
    steps = 60
    c = subprocess.Popen(
        [sys.executable, "-c", FROZEN.format(repo=str(REPO), rdv=str(tmp_path), steps=steps)],
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    notices = {r: tmp_path / f"{r}.lost.jsonl" for r in ("a", "b")}
    engines = {r: _engine(r, tmp_path, steps, notices[r]) for r in ("a", "b")}
    logs: dict[str, list[Any]] = {"a": [], "b": []}
    done_at: dict[str, float] = {}

    def go(r: str) -> None:
        train(engines[r], r, steps, logs[r], dt=0.03)
        done_at[r] = time.monotonic()
        engines[r].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in ("a", "b")]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90
        while not (logs["a"] and logs["a"][-1][0] >= 12) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logs["a"], "region a never trained"
        os.kill(c.pid, signal.SIGSTOP)  # partitioned: connections hang, nothing is refused
        frozen_at = time.monotonic()
        time.sleep(1.0)  # the survivors now wait on c in a round
        for r in ("a", "b"):  # what the agent does on the control plane's PeerLost
            append_notice(notices[r], LostNotice("c", "", "node missed 3 heartbeats"))
        for t in threads:
            t.join(90)
        assert set(done_at) == {"a", "b"}
        # Dropped at the notice: the rest of the run (about 48 steps x 30 ms) plus the notice's
        # half-second look, far below the timeout the survivors would otherwise wait per round.
        assert max(done_at.values()) - frozen_at < TIMEOUT_S / 2, max(done_at.values()) - frozen_at
        events = [e for r in ("a", "b") for _, m in logs[r] for e in m.get("events", [])]
        assert any(e.startswith("drop c: lost, per the control plane") for e in events), events
        assert all(s == steps for s in (logs["a"][-1][0], logs["b"][-1][0]))
    finally:
        os.kill(c.pid, signal.SIGKILL)
        c.wait()
        for t in threads:
            t.join(5)
