"""The preemption policy as properties: who may be preempted, and the fewest that make room."""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from control_layer.victim_choice import (
    NOT_PREEMPTIBLE,
    RunningJob,
    candidates,
    choose_victims,
    why_no_preemption,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[RunningJob], int, int]:
    """Running jobs on distinct devices, the number of devices free now, and the queued job's need."""
    n = draw(st.integers(0, 8))
    jobs, next_device = [], 0
    for i in range(n):
        k = draw(st.integers(1, 4))
        jobs.append(
            RunningJob(
                job_id=f"j{i}",
                priority=draw(st.integers(-2, 2)),
                preemptible=draw(st.booleans()),
                devices=frozenset(range(next_device, next_device + k)),
                started_at=T0 + timedelta(minutes=draw(st.integers(0, 60))),
            )
        )
        next_device += k
    return jobs, draw(st.integers(0, 3)), draw(st.integers(1, 12))


def _fits(free_now: int, need: int):
    def fits(freed: frozenset[Hashable]) -> bool:
        return free_now + len(freed) >= need

    return fits


@given(fleets(), st.integers(-2, 3))
def test_victims_are_preemptible_lower_priority_and_make_exactly_enough_room(fleet, priority) -> None:
    running, free_now, need = fleet
    fits = _fits(free_now, need)
    victims = choose_victims(running, priority, fits)
    for v in victims:
        assert v.preemptible and v.priority < priority
    if not victims:
        eligible = candidates(running, priority)
        all_freed = frozenset().union(*(v.devices for v in eligible))
        assert fits(frozenset()) or not fits(all_freed)  # nothing to do, or nothing would help
        return
    freed = frozenset().union(*(v.devices for v in victims))
    assert not fits(frozenset()) and fits(freed)
    for v in victims:  # minimal: every victim is needed
        rest = [w for w in victims if w is not v]
        assert not fits(frozenset().union(*(w.devices for w in rest)))


def test_lowest_priority_then_smallest_then_newest_go_first() -> None:
    def job(i: str, prio: int, n: int, minute: int) -> RunningJob:
        devices = frozenset(f"{i}-{d}" for d in range(n))
        return RunningJob(i, prio, True, devices, T0 + timedelta(minutes=minute))

    low_big, low_small, mid_small = job("low-big", -1, 4, 0), job("low-small", -1, 1, 0), job("mid", 0, 1, 0)
    old, new = job("old", 0, 2, 0), job("new", 0, 2, 30)
    three = [mid_small, low_big, low_small]
    assert [v.job_id for v in candidates(three, 1)] == ["low-small", "low-big", "mid"]
    assert [v.job_id for v in candidates([old, new], 1)] == ["new", "old"]
    not_preemptible = RunningJob("np", -5, False, frozenset({"x"}), T0)
    same_priority = RunningJob("eq", 1, True, frozenset({"y"}), T0)
    assert candidates([not_preemptible, same_priority], 1) == []
    # one device needed: the lowest-priority smallest job alone
    assert [v.job_id for v in choose_victims(three, 1, _fits(0, 1))] == ["low-small"]
    # three needed: the small one is added first, then pruned once the big one alone suffices
    assert [v.job_id for v in choose_victims(three, 1, _fits(0, 3))] == ["low-big"]


def test_a_waiting_job_is_told_when_the_lower_priority_work_does_not_allow_preemption() -> None:
    assert why_no_preemption(10, lowest_active=0, lowest_preemptible=None) == NOT_PREEMPTIBLE
    # preemptible work exists, but not below this job: nothing it may take
    assert why_no_preemption(10, lowest_active=0, lowest_preemptible=10) == NOT_PREEMPTIBLE
    assert why_no_preemption(10, lowest_active=0, lowest_preemptible=5) is None  # it may preempt
    assert why_no_preemption(0, lowest_active=0, lowest_preemptible=None) is None  # nothing below it
    assert why_no_preemption(5, lowest_active=None, lowest_preemptible=None) is None  # nothing runs
