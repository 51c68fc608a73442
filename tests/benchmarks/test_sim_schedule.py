"""Pipeline schedules in the simulator against closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.sim.network import Network
from benchmarks.sim.schedule import Pipeline, StageTimes, stage_ops


def _free(a: object, b: object) -> tuple[tuple[object, ...], float, str]:
    return (), 0.0, "free"


def _hop(h: float):
    def route(a: object, b: object) -> tuple[tuple[object, ...], float, str]:
        return (), h, "hop"

    return route


def _run(pp: int, m: int, schedule: str, f: float, b: float, route=_free, tp: int = 1) -> tuple[float, list]:
    net = Network({})
    finished: list[int] = []
    devices = [[(s, t) for t in range(tp)] for s in range(pp)]
    pipe = Pipeline(net, route, devices, [StageTimes(f, b)] * pp, schedule, m, 1.0, finished.append)
    pipe.start()
    return net.run(), finished


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@settings(max_examples=30, deadline=None)
@given(pp=st.integers(1, 6), m=st.integers(1, 12), f=st.floats(0.01, 10.0), b=st.floats(0.01, 10.0))
def test_zero_cost_links_idle_pp_minus_1_micro_batch_slots(
    schedule: str, pp: int, m: int, f: float, b: float
) -> None:
    end, finished = _run(pp, m, schedule, f, b)
    assert sorted(finished) == list(range(pp))
    assert end == pytest.approx((m + pp - 1) * (f + b), rel=1e-9)
    assert end - m * (f + b) == pytest.approx((pp - 1) * (f + b), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_one_micro_batch_pays_every_hop_twice(schedule: str) -> None:
    end, _ = _run(3, 1, schedule, 1.0, 2.0, route=_hop(0.5), tp=2)
    assert end == pytest.approx(3 * (1.0 + 2.0) + 2 * 2 * 0.5)


@settings(max_examples=50, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 16))
def test_1f1b_runs_every_micro_batch_once_and_keeps_at_most_pp_minus_stage_in_flight(pp: int, m: int) -> None:
    for s in range(pp):
        ops = stage_ops("1f1b", pp, s, m)
        assert sorted(op for op in ops if op[0] == "F") == [("F", i) for i in range(m)]
        assert sorted(op for op in ops if op[0] == "B") == [("B", i) for i in range(m)]
        in_flight = 0
        for kind, i in ops:
            in_flight += 1 if kind == "F" else -1
            assert 0 <= in_flight <= pp - s
            if kind == "B":
                assert ("F", i) in ops[: ops.index((kind, i))]


def test_gpipe_runs_all_forwards_first() -> None:
    assert stage_ops("gpipe", 2, 0, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    with pytest.raises(ValueError, match="schedule"):
        stage_ops("zb", 2, 0, 3)
