"""The leader's metrics sink: a bounded line rate that loses no bytes, no checkpoint and no sync
membership event."""

from __future__ import annotations

import functools
import io
import json
import math
from types import SimpleNamespace

from agent.output import MetricsTracker, parse_prefixed
from contracts.metrics import METRIC_PREFIX
from training.metrics import JsonLinesSink
from training.runtime import Trainer


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _steps(n: int) -> list[dict]:
    """Steps of 0.25 s; bytes per peer on some, a plain number on others; a checkpoint at step 7."""
    out = []
    for step in range(1, n + 1):
        sent = {"b": 100 * step, "c": 1} if step % 3 == 0 else 10
        m = {"step": step, "loss": 1.0 / step, "sync": {"bytes_sent": sent, "bytes_recv": step}}
        if step >= 7:
            m["checkpoint_step"] = 7
        out.append(m)
    return out


def _run(interval: float, steps: list[dict], tmp_path) -> tuple[list[dict], list[dict]]:
    clock, stream = Clock(), io.StringIO()
    sink = JsonLinesSink(tmp_path / "m.jsonl", stream=stream, min_interval_s=interval, clock=clock)
    for m in steps:
        sink(m)
        clock.t += 0.25
    sink.flush()
    printed = [parse_prefixed(line, METRIC_PREFIX) for line in stream.getvalue().splitlines()]
    written = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    return printed, written


def test_every_step_without_an_interval(tmp_path) -> None:
    steps = _steps(12)
    printed, written = _run(0.0, steps, tmp_path)
    assert printed == written and [m["step"] for m in printed] == list(range(1, 13))
    assert printed[2]["wan_bytes_sent"] == 10 + 10 + 301  # running totals, per-peer counts summed
    assert printed[-1]["wan_bytes_recv"] == sum(range(1, 13))


def test_an_interval_bounds_the_lines_and_keeps_totals_checkpoints_and_the_last_step(tmp_path) -> None:
    steps = _steps(12)
    printed, _ = _run(1.0, steps, tmp_path)
    got = [m["step"] for m in printed]
    # t = 0 and 1 s (steps 1, 5), at once for the new checkpoint (step 7, t = 1.5 s), a second after
    # that (step 11), and the last by flush
    assert got == [1, 5, 7, 11, 12]
    every, _ = _run(0.0, steps, tmp_path / "all")
    assert printed[-1]["wan_bytes_sent"] == every[-1]["wan_bytes_sent"]
    assert printed[-1]["wan_bytes_recv"] == every[-1]["wan_bytes_recv"]
    assert printed[2]["checkpoint_step"] == 7


def test_membership_events_go_out_at_once_and_none_is_lost(tmp_path) -> None:
    steps = _steps(12)
    steps[2]["sync"]["events"] = ["drop b: lost, per the control plane: node lost"]  # t = 0.5 s
    steps[9]["sync"]["events"] = ["rejoin b from round 4"]
    printed, _ = _run(1.0, steps, tmp_path)
    assert [m["step"] for m in printed] == [1, 3, 7, 10, 12]  # steps 3 and 10 at once
    events = [e for m in printed for e in m["sync"].get("events", ())]
    assert events == ["drop b: lost, per the control plane: node lost", "rejoin b from round 4"]


def test_the_agent_counts_the_same_bytes_from_fewer_lines(tmp_path) -> None:
    steps = _steps(30)
    sparse, _ = _run(1.0, steps, tmp_path)
    dense, _ = _run(0.0, steps, tmp_path / "all")
    a, b = MetricsTracker(total_steps=30), MetricsTracker(total_steps=30)
    for m in sparse:
        a.update(m)
    for m in dense:
        b.update(m)
    assert len(sparse) < len(dense) / 3
    assert a.latest is not None and a.latest == b.latest  # totals, step, loss, checkpoint: the same


def test_the_leader_takes_sync_metrics_after_exchanges_and_else_at_the_reporting_rate() -> None:
    trainer = SimpleNamespace(cfg=SimpleNamespace(metrics_interval_s=60.0), sync_metrics_at=-math.inf)
    due = functools.partial(Trainer._sync_metrics_due, trainer)
    assert due(False)  # the first step
    assert [due(False) for _ in range(5)] == [False] * 5  # within the interval: nothing to send yet
    assert due(True) and due(True)  # a step that exchanged: read while the connections are up
    trainer.cfg.metrics_interval_s = 0.0
    assert all(due(False) for _ in range(3))  # no interval: every step, as before
