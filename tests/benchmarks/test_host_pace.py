"""A benchmark's waits for its own parts: ceilings scaled by the host's pace, never below the base."""

from __future__ import annotations

import pytest

from benchmarks._host import pace, patience


def test_a_ceiling_is_the_base_times_the_hosts_pace_measured_once() -> None:
    first = pace()
    assert first >= 1.0 and pace() == first  # measured once, then the same for every wait
    assert patience(120.0) == 120.0 * first
    assert patience(300.0) == pytest.approx(2.5 * patience(120.0), rel=1e-12)  # the same scale
