"""Which of a task's stored lines to rotate out. Pure: sizes in, a cut out.

A task keeps at most ``max_lines`` lines and ``max_bytes`` bytes. Rotation runs once a task is
over either bound and cuts it down to a low-water mark (90 %), so it runs once per tenth of the
bound rather than on every append. The oldest lines go; the newest removed row becomes a marker
saying how many lines it stands for, so a reader sees that something was dropped and how much.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LOW_WATER = 0.9
MARKER_STREAM = "cpn"
# A marker's text stays far below this; the byte budget reserves it so the marker fits.
MARKER_BYTES = 120


@dataclass(frozen=True)
class LogBounds:
    max_lines: int
    max_bytes: int

    def __post_init__(self) -> None:
        if self.max_lines < 2 or self.max_bytes < 2 * MARKER_BYTES:
            raise ValueError(f"log bounds too small to hold a line and a marker: {self}")

    @property
    def keep_lines(self) -> int:
        return max(2, int(self.max_lines * LOW_WATER))

    @property
    def keep_bytes(self) -> int:
        return max(2 * MARKER_BYTES, int(self.max_bytes * LOW_WATER))


def over(lines: int, nbytes: int, bounds: LogBounds) -> bool:
    """Whether a task holding ``lines`` lines of ``nbytes`` bytes must be rotated now."""
    return lines > bounds.max_lines or nbytes > bounds.max_bytes


def rotation_cut(newest_first: Sequence[tuple[int, int]], bounds: LogBounds) -> int | None:
    """The seq of the newest row to remove (every older row goes too, this one becomes the marker),
    given the task's rows as ``(seq, bytes)`` newest first; None when all of them fit.

    The rows kept (newer than the cut) number at most ``keep_lines - 1`` and weigh at most
    ``keep_bytes - MARKER_BYTES``, so with the marker the task is back at the low-water mark."""
    room_lines = bounds.keep_lines - 1
    room_bytes = bounds.keep_bytes - MARKER_BYTES
    kept_bytes = 0
    for kept, (seq, size) in enumerate(newest_first):
        if kept >= room_lines or kept_bytes + size > room_bytes:
            return seq
        kept_bytes += size
    return None


def rotated_marker(count: int) -> str:
    return f"[cpn] {count} older lines rotated out"


def dropped_marker(count: int) -> str:
    return f"[cpn] {count} lines dropped: the control plane was behind (the node's worker.log has them)"
