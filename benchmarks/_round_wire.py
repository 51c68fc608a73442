"""Each exchange round's time against the time its bytes need at the shaped rate.

The workers report when each exchange opened and completed (``round_spans`` in a task's result,
unix seconds); a sampler thread here reads every region's veth tx counter at a fine interval
(``/proc/<pid>/net/dev`` of a process inside the region's namespace: a file read, no process
started per sample). Per round, the region that opened it last is the one whose span is all the
round's work and no wait for a peer's compute: its span over the bytes it put on its link within
it (interpolated between samples) at the link rate is the round's figure. It cannot be below 1:
those bytes crossed the shaped link within the span.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

Span = tuple[float, float]
# At least this many bytes in the round for a figure: a round of a few frames says nothing of rate.
MIN_ROUND_BYTES = 1 << 16


def read_tx(pid: int, dev: str) -> int | None:
    """``dev``'s tx bytes in the network namespace of process ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == dev:
                    return int(rest.split()[8])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class TxSampler:
    """Samples each region's tx counter every ``interval_s`` in a thread, while in its ``with``."""

    devices: dict[str, tuple[int, str]]  # region -> (pid inside its namespace, its veth)
    interval_s: float = 0.005
    samples: dict[str, tuple[list[float], list[int]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> TxSampler:
        self.samples = {r: ([], []) for r in self.devices}
        self._thread = threading.Thread(target=self._run, name="tx-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for region, (pid, dev) in self.devices.items():
                tx = read_tx(pid, dev)
                if tx is not None:
                    ts, vs = self.samples[region]
                    ts.append(time.time())
                    vs.append(tx)

    def tx_between(self, region: str, a: float, b: float) -> float | None:
        """Bytes ``region`` sent within [a, b], linear between samples; None outside the samples."""
        ts, vs = self.samples.get(region, ([], []))
        if not ts or a < ts[0] or b > ts[-1]:
            return None
        return _at(ts, vs, b) - _at(ts, vs, a)


def _at(ts: list[float], vs: list[int], t: float) -> float:
    i = bisect.bisect_right(ts, t)
    if i >= len(ts):
        return float(vs[-1])
    if i == 0:
        return float(vs[0])
    t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else float(v1)


def round_figures(
    spans: dict[str, list[Span]], tx_between: Any, rate_bytes_per_s: float
) -> list[dict[str, float]]:
    """Per round (the k-th span of every region), the last opener's span, its bytes and the ratio.
    Rounds some region lacks (it joined late, or the run ended short) are left out."""
    n = min((len(s) for s in spans.values()), default=0)
    out = []
    for k in range(n):
        region, (a, b) = max(((r, s[k]) for r, s in spans.items()), key=lambda x: x[1][0])
        nbytes = tx_between(region, a, b)
        if nbytes is None or nbytes < MIN_ROUND_BYTES:
            continue
        out.append({"round_s": b - a, "bytes": nbytes, "ratio": (b - a) / (nbytes / rate_bytes_per_s)})
    return out


def summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The median round's time, bytes and ratio (None without a round)."""
    if not rounds:
        return {"round_time_over_wire_p50": None, "round_s_p50": None, "round_bytes_p50": None, "rounds": 0}
    return {
        "round_time_over_wire_p50": statistics.median(r["ratio"] for r in rounds),
        "round_s_p50": statistics.median(r["round_s"] for r in rounds),
        "round_bytes_p50": statistics.median(r["bytes"] for r in rounds),
        "rounds": len(rounds),
    }
