"""What the control plane stores of a probe: checked against the order, bounded in history."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from contracts.errors import FailedPrecondition, InvalidArgument, NotFound
from orchestration.db.base import utcnow
from orchestration.db.models import LinkProbe
from resource_layer.link_probes import KEEP_PER_PAIR, expire_pending, record_result
from tests.resource_layer.harness import sqlite_context


@pytest.fixture
def session_factory(tmp_path: Path):  # type: ignore[no-untyped-def]
    ctx = sqlite_context(tmp_path)
    yield ctx.session_factory
    ctx.bus.close()


def order(session, age_s: float = 0.0) -> str:  # type: ignore[no-untyped-def]
    row = LinkProbe(
        src_region="eu",
        dst_region="us",
        src_node_id="na",
        dst_node_id="nb",
        bulk_bytes=4 << 20,
        echoes=5,
        requested_at=utcnow() - timedelta(seconds=age_s),
    )
    session.add(row)
    session.flush()
    return row.id


GOOD = {"rtt_ms": 12.0, "bulk_bytes": 4_000_000, "bulk_s": 0.32, "duration_s": 0.4}


def test_a_result_is_stored_once_and_only_from_the_prober(session_factory) -> None:  # type: ignore[no-untyped-def]
    with session_factory() as s, s.begin():
        pid = order(s)
        with pytest.raises(NotFound):
            record_result(s, "nb", {"probe_id": pid, **GOOD})  # the target, not the prober
        row = record_result(s, "na", {"probe_id": pid, **GOOD})
        assert row.status == "ok" and row.bandwidth_gbps == pytest.approx(0.1)
        assert row.rtt_ms == 12.0 and row.duration_s == 0.4 and row.finished_at is not None
        with pytest.raises(FailedPrecondition):
            record_result(s, "na", {"probe_id": pid, **GOOD})


@pytest.mark.parametrize(
    "bad",
    [{"rtt_ms": float("nan")}, {"bulk_s": float("inf")}, {"bulk_bytes": -1}],
)
def test_non_finite_or_negative_figures_are_refused_and_change_nothing(session_factory, bad) -> None:  # type: ignore[no-untyped-def]
    with session_factory() as s, s.begin():
        pid = order(s)
        with pytest.raises(InvalidArgument):
            record_result(s, "na", {"probe_id": pid, **GOOD, **bad})
        assert s.get(LinkProbe, pid).status == "pending"  # type: ignore[union-attr]


def test_implausible_figures_and_reported_errors_mark_the_probe_failed(session_factory) -> None:  # type: ignore[no-untyped-def]
    with session_factory() as s, s.begin():
        more = record_result(s, "na", {"probe_id": order(s), **GOOD, "bulk_bytes": 5 << 20})
        fast = record_result(s, "na", {"probe_id": order(s), **GOOD, "bulk_s": 1e-9})
        told = record_result(s, "na", {"probe_id": order(s), "error": "UNAVAILABLE", "duration_s": 2.0})
    assert [r.status for r in (more, fast, told)] == ["failed"] * 3
    assert "implausible" in more.error and "bandwidth" in fast.error and told.error == "UNAVAILABLE"
    assert told.duration_s == 2.0 and told.bandwidth_gbps is None  # the budget still counts its time


def test_history_is_bounded_and_silent_probes_expire(session_factory) -> None:  # type: ignore[no-untyped-def]
    with session_factory() as s, s.begin():
        ids = [order(s, age_s=1000 - i) for i in range(KEEP_PER_PAIR + 5)]
        stale = order(s, age_s=120)
        record_result(s, "na", {"probe_id": ids[-1], **GOOD})
        assert s.scalar(select(func.count()).select_from(LinkProbe)) == KEEP_PER_PAIR
        assert s.get(LinkProbe, ids[0]) is None and s.get(LinkProbe, ids[-1]) is not None
        assert expire_pending(s, timeout_s=60, now=utcnow()) >= 1
        assert s.get(LinkProbe, stale).status == "failed"  # type: ignore[union-attr]
