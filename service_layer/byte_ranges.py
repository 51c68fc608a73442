"""HTTP ``Range: bytes=...`` of one blob, pure: which bytes to send, or why none can be."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ONE_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


class Unsatisfiable(Exception):
    """The range starts past the end (HTTP 416, ``Content-Range: bytes */size``)."""


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The one range ``header`` asks of ``size`` bytes; None: send everything (no header, or one
    this server does not serve in part: several ranges, another unit, a malformed one)."""
    if not header:
        return None
    match = _ONE_RANGE.match(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.group(1), match.group(2)
    if first == "":  # the last N bytes
        n = int(last)
        if n == 0:
            raise Unsatisfiable
        return ByteRange(max(0, size - n), size - 1) if size else None
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if last != "" and int(last) < start:
        return None  # invalid: ignored, as RFC 9110 says
    if start >= size:
        raise Unsatisfiable
    return ByteRange(start, end)
