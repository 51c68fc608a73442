"""Per-step metrics and where they go.

The train loop hands every step's metrics to a callback. The worker's default callback runs on the
leader only: it appends a JSON line to ``metrics_path`` and prints ``CPN_METRIC {json}`` to stdout,
which the agent forwards. The run ends with one ``CPN_RESULT {json}`` line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX

MetricsCallback = Callable[[dict[str, Any]], None]


class JsonLinesSink:
    """Leader-side default callback: a JSON-lines file (optional) and a stdout line per step."""

    def __init__(self, path: str | Path | None, stream: TextIO | None = None) -> None:
        self.path = Path(path) if path else None
        self.stream = stream or sys.stdout
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, metrics: dict[str, Any]) -> None:
        line = json.dumps(metrics, sort_keys=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")
        print(METRIC_PREFIX + line, file=self.stream, flush=True)


def emit_result(result: dict[str, Any], stream: TextIO | None = None) -> None:
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), file=stream or sys.stdout, flush=True)
