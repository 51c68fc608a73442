"""Per-step metrics and where they go.

The train loop hands every step's metrics to a callback. The worker's default callback runs on the
leader only: it appends a JSON line to ``metrics_path`` and prints ``CPN_METRIC {json}`` to stdout,
which the agent forwards. The run ends with one ``CPN_RESULT {json}`` line.

A line per step wakes the agent on the same host once a step; with ``min_interval_s`` the sink
writes at most that often (plus every new checkpoint and the run's last step), and each line
carries the run's WAN byte totals, so a step it did not write loses no bytes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX

MetricsCallback = Callable[[dict[str, Any]], None]


def _bytes(x: Any) -> int:
    """A byte count reported either as a number or per peer region ``{region: n}``."""
    if isinstance(x, dict):
        return sum(_bytes(v) for v in x.values())
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return int(x) if ok else 0


class JsonLinesSink:
    """Leader-side default callback: a JSON-lines file (optional) and a stdout line, at most every
    ``min_interval_s`` (0: every step). Call ``flush`` after the run for a step held back."""

    def __init__(
        self,
        path: str | Path | None,
        stream: TextIO | None = None,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path) if path else None
        self.stream = stream or sys.stdout
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.sent = self.recv = 0
        self._written_at = -math.inf
        self._checkpoint: Any = None
        self._pending: dict[str, Any] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, metrics: dict[str, Any]) -> None:
        sync = metrics.get("sync") if isinstance(metrics.get("sync"), dict) else {}
        self.sent += _bytes(sync.get("bytes_sent", 0))
        self.recv += _bytes(sync.get("bytes_recv", 0))
        payload = {**metrics, "wan_bytes_sent": self.sent, "wan_bytes_recv": self.recv}
        now = self.clock()
        # A new checkpoint goes out at once: the control plane resumes from the latest it heard of.
        # So do the sync engine's membership events (a peer dropped, rejoined, left): a payload
        # held back is replaced by the next, and its events would be lost with it.
        news = metrics.get("checkpoint_step") != self._checkpoint or bool(sync.get("events"))
        if news or now - self._written_at >= self.min_interval_s:
            self._write(payload, now)
        else:
            self._pending = payload

    def flush(self) -> None:
        if self._pending is not None:
            self._write(self._pending, self.clock())

    def _write(self, payload: dict[str, Any], now: float) -> None:
        self._pending, self._written_at = None, now
        self._checkpoint = payload.get("checkpoint_step")
        line = json.dumps(payload, sort_keys=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")
        print(METRIC_PREFIX + line, file=self.stream, flush=True)


def emit_result(result: dict[str, Any], stream: TextIO | None = None) -> None:
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), file=stream or sys.stdout, flush=True)
