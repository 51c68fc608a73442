"""Transfer accounting shared by the client and server sides of one region's transport."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TransferStats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    recv: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total_recv: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # (bytes, seconds from first data byte sent to last received, shaped rate in bytes/s or None)
    transfers: list[tuple[int, float, float | None]] = field(default_factory=list)

    def add_sent(self, peer: str, n: int) -> None:
        with self.lock:
            self.sent[peer] += n
            self.total_sent[peer] += n

    def add_recv(self, peer: str, n: int) -> None:
        with self.lock:
            self.recv[peer] += n
            self.total_recv[peer] += n

    def add_transfer(self, nbytes: int, seconds: float, rate: float | None) -> None:
        with self.lock:
            self.transfers.append((nbytes, seconds, rate))

    def take(self) -> dict[str, Any]:
        """What happened since the last call."""
        with self.lock:
            out = {"bytes_sent": dict(self.sent), "bytes_recv": dict(self.recv), "transfers": self.transfers}
            self.sent, self.recv, self.transfers = defaultdict(int), defaultdict(int), []
        return out


def goodput_fraction(
    transfers: list[tuple[int, float, float | None]], min_bytes: int = 1 << 16
) -> float | None:
    """Bytes over time of shaped transfers, against the time the shaped rate needs for them
    (byte-weighted); None without a shaped transfer of at least ``min_bytes``."""
    need = spent = 0.0
    for nbytes, seconds, rate in transfers:
        if rate and nbytes >= min_bytes and seconds > 0:
            need += nbytes / rate
            spent += seconds
    return need / spent if spent else None
