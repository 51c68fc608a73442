"""Reading a worker's output: metric and result lines, and a budget for forwarded log lines. Pure."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

ERROR_PREFIX = "CPN_ERROR "
# TaskMetrics field -> the worker's metric name, for the step's time by part.
STEP_PARTS = {
    "data_s": "data_s",
    "compute_s": "compute_s",
    "optimizer_s": "optimizer_s",
    "sync_s": "sync_s",
    "checkpoint_s": "checkpoint_s",
    "step_wall_s": "wall_s",
}
# Optional TaskMetrics fields a worker reports under the same name on some steps only (or some
# workers only: the job step, where balanced rounds make the region's step count its own).
SOMETIMES = ("gossip_spread", "job_step")


def parse_prefixed(line: str, prefix: str) -> dict[str, Any] | None:
    """The JSON object after ``prefix``, or None when the line is something else (or garbled)."""
    if not line.startswith(prefix):
        return None
    try:
        value = json.loads(line[len(prefix) :])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _number(x: Any) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0


def _total(x: Any) -> float:
    """A byte count reported either as a number or per peer region ``{region: n}``."""
    if isinstance(x, dict):
        return sum(_number(v) for v in x.values())
    return _number(x)


@dataclass
class MetricsTracker:
    """Turns the worker's per-step metric payloads into TaskMetrics fields.

    The worker's sync section reports WAN bytes since its previous report; the agent sends running
    totals, so a coalesced or dropped report loses no bytes.
    """

    total_steps: int = 0
    wan_sent: float = 0.0
    wan_recv: float = 0.0
    wire_sent: int | None = None  # the worker's running total from the kernel; None: unavailable
    latest: dict[str, Any] | None = field(default=None)

    def update(self, payload: dict[str, Any]) -> dict[str, Any]:
        sync = payload.get("sync") if isinstance(payload.get("sync"), dict) else {}
        self.wan_sent += _total(sync.get("bytes_sent", 0))
        self.wan_recv += _total(sync.get("bytes_recv", 0))
        if "wan_bytes_sent" in payload:  # a worker that keeps its own totals
            self.wan_sent = _number(payload["wan_bytes_sent"])
        if "wan_bytes_recv" in payload:
            self.wan_recv = _number(payload["wan_bytes_recv"])
        wire = sync.get("wire_bytes_sent_total")
        if isinstance(wire, int) and not isinstance(wire, bool) and wire >= 0:
            self.wire_sent = max(wire, self.wire_sent or 0)
        self.latest = {
            "step": int(_number(payload.get("step"))),
            "total_steps": int(_number(payload.get("total_steps", self.total_steps))),
            "loss": _number(payload.get("loss")),
            "tokens_per_s": _number(payload.get("tokens_per_s")),
            "compute_utilization": _number(payload.get("compute_utilization", payload.get("compute_util"))),
            "wan_bytes_sent": int(self.wan_sent),
            "wan_bytes_recv": int(self.wan_recv),
            "sync_latency_s": _number(payload.get("sync_latency_s", sync.get("latency_s", 0))),
            "wall_time_s": _number(payload.get("wall_time_s", payload.get("wall_s"))),
            "checkpoint_step": int(_number(payload.get("checkpoint_step", 0))),
        }
        if self.wire_sent is not None:
            self.latest["wan_wire_bytes_sent"] = self.wire_sent
        # The step's parts and the gossip spread pass through only when the worker reported them
        # (optional fields).
        for key, name in [*STEP_PARTS.items(), *((k, k) for k in SOMETIMES)]:
            value = payload.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.latest[key] = float(value)
        return self.latest


@dataclass
class LineBudget:
    """Token bucket for forwarded log lines: ``rate`` per second, bursts up to ``burst``.

    Lines over budget are counted; the next line let through is preceded by a note of how many
    were dropped (the full output stays in the assignment's log file on the node).
    """

    rate: float
    burst: int
    tokens: float = -1.0
    last: float = 0.0
    dropped: int = 0

    def admit(self, now: float) -> tuple[bool, int]:
        """(forward this line?, lines dropped since the last forwarded one)."""
        if self.tokens < 0:
            self.tokens, self.last = float(self.burst), now
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1.0:
            self.dropped += 1
            return False, 0
        self.tokens -= 1.0
        dropped, self.dropped = self.dropped, 0
        return True, dropped
