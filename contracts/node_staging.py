"""What a node reports of staging: its measured cost of bringing a task's code and data (its link
to the artifact store, a venv build) and what its cache already holds. Pure checks, each problem
naming its field; nothing here touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contracts.artifacts import DIGEST_RE

MAX_CACHE_ENTRIES = 4096  # per list of a cache report: the most recently used, the rest unreported
MAX_FETCH_FIXED_S = 600.0  # one fetch's fixed seconds beyond this is no measurement of a link
MAX_VENV_S = 86_400.0
MIN_BYTES_PER_S, MAX_BYTES_PER_S = 1.0, 1e13  # 1 B/s to 10 TB/s
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class StagingProbe:
    """A node's staging figures as its agent measured them (0: not measured).

    fetch_fixed_s: seconds one fetch from the store takes beyond its bytes; bytes_per_s: the
    store's bytes per second to the node beyond that; probe_bytes: the bulk fetch's size; venv_s:
    CPU seconds of one venv build with its requirements already on the node; error: why the store
    part was not measured."""

    fetch_fixed_s: float = 0.0
    bytes_per_s: float = 0.0
    probe_bytes: int = 0
    venv_s: float = 0.0
    error: str = ""

    @property
    def store_measured(self) -> bool:
        return self.bytes_per_s > 0 and not self.error

    def as_dict(self) -> dict[str, Any]:
        return {
            "fetch_fixed_s": self.fetch_fixed_s,
            "bytes_per_s": self.bytes_per_s,
            "probe_bytes": self.probe_bytes,
            "venv_s": self.venv_s,
            "error": self.error,
        }


def staging_probe_problems(p: StagingProbe) -> list[str]:
    """Every problem with a report, each naming its field (empty: it may be stored)."""
    problems = []
    for name, value, top in (
        ("fetch_fixed_s", p.fetch_fixed_s, MAX_FETCH_FIXED_S),
        ("venv_s", p.venv_s, MAX_VENV_S),
    ):
        if not (math.isfinite(value) and 0.0 <= value <= top):
            problems.append(f"{name}: {value} is not a number of seconds in [0, {top:g}]")
    rate = p.bytes_per_s
    if not (math.isfinite(rate) and (rate == 0.0 or MIN_BYTES_PER_S <= rate <= MAX_BYTES_PER_S)):
        span = f"[{MIN_BYTES_PER_S:g}, {MAX_BYTES_PER_S:g}]"
        problems.append(f"bytes_per_s: {rate} is neither 0 nor a rate in {span}")
    if p.probe_bytes < 0:
        problems.append(f"probe_bytes: {p.probe_bytes} is negative")
    if len(p.error) > MAX_ERROR_CHARS:
        problems.append(f"error: longer than {MAX_ERROR_CHARS} characters")
    return problems


def cache_report_problems(blobs: Sequence[str], venvs: Sequence[str]) -> list[str]:
    """Every problem with a cache report (empty: it may be stored)."""
    problems = []
    for name, entries in (("blobs", blobs), ("venvs", venvs)):
        if len(entries) > MAX_CACHE_ENTRIES:
            problems.append(f"{name}: at most {MAX_CACHE_ENTRIES} entries, got {len(entries)}")
        bad = next((e for e in entries if not DIGEST_RE.match(e)), None)
        if bad is not None:
            problems.append(f"{name}: {bad[:80]!r} is not sha256:<64 hex digits>")
    return problems
