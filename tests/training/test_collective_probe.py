"""The all-reduce a node's CPU ranks pay: the probe's fit from timed calls, and one real
measurement between two forked gloo ranks."""

from __future__ import annotations

import pytest

from training import collective_probe as cp


def test_the_fit_separates_a_calls_fixed_cost_its_payload_rate_and_the_wait() -> None:
    # Small calls of 0.2 ms, large ones 3.5 ms more (the 4 MiB less 4 KiB at ~10 Gb/s), and
    # crowded iterations of both pairs' work (2 x 2 ms) and a call, one in four of them waiting
    # 12 ms on its two hops: 1.5 ms per hop on the mean, which a run of many steps pays.
    rate_s = (cp.LARGE_BYTES - cp.SMALL_BYTES) * 8 / 10e9
    small = [2e-4] * 20 + [5e-3] * 4  # a few calls a neighbour delayed: trimmed
    large = [2e-4 + rate_s] * 8
    crowded = [4e-3 + 2e-4] * 9 + [4e-3 + 2e-4 + 12e-3] * 3
    f = cp.fit(small, large, crowded, work_s=2e-3)
    assert f.call_s == pytest.approx(2e-4)
    assert f.gbps == pytest.approx(10.0)
    assert f.wait_s == pytest.approx(1.5e-3)
    # Crowded iterations no slower than the work and the call: no wait, never a negative one.
    assert cp.fit(small, large, [4e-3 + 1e-4] * 8, work_s=2e-3).wait_s == 0.0
    with pytest.raises(ValueError, match="no samples"):
        cp.fit(small, large, [], work_s=2e-3)


def test_times_that_do_not_separate_are_no_measurement() -> None:
    with pytest.raises(ValueError, match="do not separate"):
        cp.fit([1e-3] * 8, [1e-3] * 8, [1e-3] * 8, work_s=0.0)
    with pytest.raises(ValueError, match="no samples"):
        cp.interquartile_mean([])


def test_two_forked_ranks_measure_this_hosts_all_reduce() -> None:
    f = cp.measure()
    assert 0 < f.call_s < 1.0
    assert f.gbps > 0
    assert f.wait_s >= 0


def test_a_series_that_does_not_separate_is_measured_again() -> None:
    # A busy host: the small calls waited for their peer longer than the large one took.
    busy = ([1.3e-3] * 8, [1.2e-3] * 8)
    idle = ([2e-4] * 8, [3e-3] * 8)
    tried: list[int] = []

    def tries():  # lazily: a try is measured only when the one before it did not separate
        for i, got in enumerate((busy, idle, busy)):
            tried.append(i)
            yield got

    assert cp.first_separating(tries()) == idle
    assert tried == [0, 1]
    with pytest.raises(ValueError, match=r"do not separate: small 0.001300 s, large 0.001200 s"):
        cp.first_separating(iter([busy, busy]))
