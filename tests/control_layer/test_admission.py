"""The admission policy's rules as properties: order, fair share, head of line, quotas."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import PaymentRequired
from control_layer.admission import (
    QueueEntry,
    QueueStrategy,
    admission_order,
    blocks_rest,
    device_quota_wait,
    positions,
    spend_refusal,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)
TENANTS = ["a", "b", "c"]

entries_st = st.lists(
    st.builds(
        QueueEntry,
        job_id=st.uuids().map(lambda u: u.hex),
        tenant_id=st.sampled_from(TENANTS),
        priority=st.integers(-3, 3),
        submitted_at=st.integers(0, 50).map(lambda s: T0 + timedelta(seconds=s)),
    ),
    max_size=40,
    unique_by=lambda e: e.job_id,
)
usage_st = st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 16))


@given(entries_st, usage_st)
def test_order_is_priority_then_fair_share_then_submission_time(entries, usage) -> None:
    order = admission_order(entries, usage)
    assert sorted(e.job_id for e in order) == sorted(e.job_id for e in entries)
    for first, then in zip(order, order[1:], strict=False):
        assert first.priority >= then.priority
        if first.priority == then.priority:
            assert usage.get(first.tenant_id, 0) <= usage.get(then.tenant_id, 0)
            if first.tenant_id == then.tenant_id:  # one tenant's jobs of a priority: first come, first served
                assert first.submitted_at <= then.submitted_at


@given(entries_st, usage_st, st.randoms())
def test_order_does_not_depend_on_how_the_rows_were_read(entries, usage, rnd) -> None:
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert admission_order(shuffled, usage) == admission_order(entries, usage)


@given(entries_st, usage_st)
def test_positions_count_from_one_in_order(entries, usage) -> None:
    order = admission_order(entries, usage)
    assert sorted(positions(order).values()) == list(range(1, len(entries) + 1))


def test_a_tenant_holding_fewer_devices_goes_first_at_equal_priority() -> None:
    early = QueueEntry("j1", "a", 0, T0)
    late = QueueEntry("j2", "b", 0, T0 + timedelta(hours=1))
    assert admission_order([early, late], {"a": 4, "b": 0}) == [late, early]
    assert admission_order([early, late], {"a": 0, "b": 0}) == [early, late]
    urgent = QueueEntry("j3", "a", 5, T0 + timedelta(hours=2))
    assert admission_order([early, late, urgent], {"a": 4})[0] == urgent  # priority before fair share


def test_only_strict_fifo_lets_a_waiting_job_hold_back_the_rest() -> None:
    assert blocks_rest(QueueStrategy.STRICT_FIFO, waiting_for_devices=True)
    assert not blocks_rest(QueueStrategy.STRICT_FIFO, waiting_for_devices=False)  # quota: its tenant's alone
    assert not blocks_rest(QueueStrategy.BEST_EFFORT_FIFO, waiting_for_devices=True)


@given(st.integers(0, 100), st.integers(1, 100), st.none() | st.integers(0, 100))
def test_device_quota_waits_exactly_when_it_would_be_exceeded(in_use, requested, cap) -> None:
    reason = device_quota_wait(in_use, requested, cap)
    assert (reason is not None) == (cap is not None and in_use + requested > cap)
    if reason is not None:
        assert f"{in_use} in use + {requested} requested > max_devices {cap}" in reason


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.floats(0, 1e6, allow_nan=False),
    st.none() | st.floats(0, 1e6, allow_nan=False),
)
def test_spend_is_refused_exactly_over_the_cap_naming_the_numbers(estimate, spent, cap) -> None:
    refusal = spend_refusal(estimate, spent, cap, "2026-11")
    assert (refusal is not None) == (cap is not None and spent + estimate > cap)
    if refusal is not None:
        assert isinstance(refusal, PaymentRequired)
        assert refusal.details["max_monthly_spend"] == cap and refusal.details["month"] == "2026-11"
        assert f"{cap:.6g}" in refusal.message and f"{estimate:.6g}" in refusal.message
