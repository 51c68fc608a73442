"""What a run's cross-region exchanges cost, summed over the run for calibration.

The step metrics say how long each step waited on the other regions (``sync_s``) and, on the
leader, which payloads arrived and how long each took to stream (``sync.transfers``). The
calibration separates the two things the cost model prices per exchange: the bytes (achieved
bandwidth, from the transfers) and the fixed cost of the exchange's calls (the wait beyond the
bytes). The first step is left out: there a region also waits for its peers to start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Smaller payloads say more about a call's fixed cost than about bandwidth.
MIN_TRANSFER_BYTES = 1 << 16


@dataclass
class ExchangeTotals:
    n: int = 0  # steps after the first that exchanged
    wait_s: float = 0.0  # their sync_s
    bytes: int = 0  # payloads of at least MIN_TRANSFER_BYTES that arrived after the first step
    transfer_s: float = 0.0  # and the seconds they took, from the sender starting to the last byte

    def add(self, m: dict[str, Any], *, exchanged: bool, joining: bool) -> None:
        if joining:
            return
        if exchanged:
            self.n += 1
            self.wait_s += float(m.get("sync_s", 0.0))
        for row in (m.get("sync") or {}).get("transfers", ()):
            nbytes, seconds = int(row[0]), float(row[1])
            if nbytes >= MIN_TRANSFER_BYTES and seconds > 0:
                self.bytes += nbytes
                self.transfer_s += seconds

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "wait_s": self.wait_s, "bytes": self.bytes, "transfer_s": self.transfer_s}
