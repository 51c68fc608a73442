"""Where a log follower is, so that a line committed late is still sent. Pure.

A line's ``seq`` is taken when it is inserted, and its transaction commits a little later. Two
replicas writing one job's lines at once can commit out of order: a follower that has read seq 120
may only then see 110 appear. So a follower does not read on from the newest seq it sent but from
a *floor*: the newest seq it had seen at a read at least ``settle_s`` ago. Any line numbered below
that had its seq taken before that read began, so its (short) transaction has committed by now.
Lines above the floor that were already sent are remembered and skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol, TypeVar

SETTLE_S = 3.0


class Numbered(Protocol):
    @property
    def seq(self) -> int: ...


L = TypeVar("L", bound=Numbered)


class FollowCursor:
    def __init__(self, after: int, settle_s: float = SETTLE_S) -> None:
        self.floor = after  # every line at or below it has been sent (or was skipped on purpose)
        self.last = after  # the newest seq sent
        self.status = "unknown"  # the job's status, as of the last read
        self._settle_s = settle_s
        self._sent: set[int] = set()  # seqs sent above the floor
        self._reads: deque[tuple[float, int]] = deque()  # (when a read ended, newest seq seen by then)

    def skip_before(self, seq: int) -> None:
        """Lines below ``seq`` are not wanted (a ``tail`` started the stream there)."""
        self.floor = max(self.floor, seq - 1)

    def unsent(self, lines: Iterable[L]) -> list[L]:
        """The lines of a read not sent yet, recorded as sent."""
        out = []
        for line in lines:
            if line.seq <= self.floor or line.seq in self._sent:
                continue
            self._sent.add(line.seq)
            self.last = max(self.last, line.seq)
            out.append(line)
        return out

    def read_done(self, now: float) -> None:
        """A read has ended at ``now``; raise the floor past the reads that have settled."""
        self._reads.append((now, self.last))
        while self._reads and now - self._reads[0][0] >= self._settle_s:
            self.floor = max(self.floor, self._reads.popleft()[1])
        self._sent = {seq for seq in self._sent if seq > self.floor}
