"""Ledger: device-hours at the locked-in price plus egress, for every task that ran, as balanced
double-entry transactions; the pure core's rounding, fee split and month periods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_layer.allocation import allocate
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, LedgerTransaction, Price
from orchestration.ledger import (
    account_balance,
    close_job,
    cost_summary,
    meter_job,
    postings_total,
    tenant_spend,
    unbalanced_transactions,
)
from orchestration.ledger.postings import (
    FEES,
    TaskMeter,
    charge_postings,
    device_micros,
    meter,
    month_bounds,
    month_segments,
    split_fee,
)
from orchestration.ledger.statements import invoice, statement
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, hand_option, tiny_spec

T0 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


def test_actual_cost_from_device_hours_and_egress(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        tenant = add_tenant(s)
        eu, (eu_node,) = add_cluster(s, region="eu-west", price=3.0, provider="lumen")
        us, (us_node,) = add_cluster(s, region="us-east", price=1.0, provider="atlas")
        add_link(s, "eu-west", "us-east", egress_price_per_gb=0.1)
        option = hand_option(
            [(eu, eu_node, 0), (eu, eu_node, 1), (us, us_node, 0)], cost=5.0, duration_s=1800
        )
        job = Job(
            tenant_id=tenant.id, name="j", spec={}, option=option.model_dump(mode="json"), estimated_cost=5.0
        )
        s.add(job)
        s.flush()
        spec = tiny_spec(training={"steps": 4, "global_batch_tokens": 48})  # 3 sequences, one per replica
        tasks = allocate(s, job, spec, option, attempt=1, platform_fee=0.2)
        # a price change after placement does not change what this job pays
        s.add(Price(cluster_id=eu.id, price_per_device_hour=100.0, effective_from=utcnow()))
        start = datetime(2026, 11, 10, 12, tzinfo=UTC)  # no month start inside: one period per meter
        for t in tasks:
            t.started_at = start
            t.last_metrics = {"step": 9, "wan_bytes_sent": 1_000_000_000 if t.region == "eu-west" else 0}
        s.flush()
        meter_job(s, job, start + timedelta(minutes=20))  # a meter while they run
        for t in tasks:
            t.finished_at = start + timedelta(hours=1)
            t.last_metrics = {"step": 9, "wan_bytes_sent": 2_000_000_000 if t.region == "eu-west" else 0}
        t_us = next(t for t in tasks if t.region == "us-east")
        t_us.result = {"wan_bytes_sent": 500_000_000}  # the result may carry the final count
        job.started_at, job.finished_at = start, start + timedelta(hours=1)
        total = close_job(s, job)
        job_id, tenant_id = job.id, tenant.id

    # eu: 2 devices x 1 h x 3.0 + 2 GB x 0.1; us: 1 x 1 x 1.0 + 0.5 GB x 0.1
    assert total == 6.0 + 0.2 + 1.0 + 0.05
    with session_scope(session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.actual_cost == total
        assert close_job(s, job) == total  # idempotent: nothing left to charge
        txs = s.scalars(select(LedgerTransaction).where(LedgerTransaction.job_id == job_id)).all()
        # two meters per task for device time, and egress in two parts for eu and in one for us
        assert sorted((t.region, t.kind) for t in txs) == sorted(
            [("eu-west", "gpu")] * 2
            + [("eu-west", "egress")] * 2
            + [("us-east", "gpu")] * 2
            + [("us-east", "egress")]
        )
        assert postings_total(s) == 0 and unbalanced_transactions(s) == []
        assert account_balance(s, f"tenant:{tenant_id}") == 7_250_000
        assert account_balance(s, "provider:lumen") == -4_800_000  # 6.0 less the 20 % fee
        assert account_balance(s, "provider:atlas") == -800_000
        assert account_balance(s, FEES) == -1_400_000
        assert account_balance(s, "platform:egress") == -250_000
        summary = cost_summary(s, job)
        assert summary["estimated"]["total"] == 5.0
        assert summary["estimated"]["device_hours"] == pytest.approx(1.5)  # 3 devices x 0.5 h
        assert summary["actual"]["device_hours"] == pytest.approx(3.0)
        assert summary["actual"]["egress_gb"] == pytest.approx(2.5)
        assert summary["actual"]["total"] == pytest.approx(total)
        assert summary["actual"]["duration_s"] == pytest.approx(3600)
        assert tenant_spend(s, tenant_id) == total
        month = month_bounds("2026-11")
        inv = invoice(s, tenant_id, *month)
        assert inv.total_micros == 7_250_000 == sum(line.amount_micros for line in inv.lines)
        st = statement(s, "lumen", *month)
        assert (st.gross_micros, st.fees_micros, st.total_micros) == (6_000_000, 1_200_000, 4_800_000)
        assert invoice(s, tenant_id, *month_bounds("2026-12")).total_micros == 0


def _task(**kw: object) -> TaskMeter:
    values: dict[str, object] = {
        "started_at": T0,
        "finished_at": None,
        "metered_until": None,
        "devices": 3,
        "price_per_device_hour": 0.7,
        "egress_price_per_gb": 0.09,
        "metered_egress_bytes": 0,
        "reported_egress_bytes": 0,
    }
    values.update(kw)
    return TaskMeter(**values)  # type: ignore[arg-type]


def test_meters_telescope_to_one_rounding_of_the_whole_run() -> None:
    end = T0 + timedelta(hours=2, seconds=1, microseconds=7)
    whole = meter(_task(finished_at=end), end + timedelta(hours=5))
    task, charged = _task(), 0
    for minutes in (1, 7, 59, 61, 119):  # meters while it runs (crossing a month start at 1 h)
        got = meter(task, T0 + timedelta(minutes=minutes, microseconds=3))
        charged += sum(c.amount_micros for c in got.charges)
        task = _task(metered_until=got.metered_until)
    got = meter(_task(metered_until=task.metered_until, finished_at=end), end + timedelta(hours=1))
    charged += sum(c.amount_micros for c in got.charges)
    assert charged == sum(c.amount_micros for c in whole.charges) == device_micros(0.7, 3, end - T0)
    assert got.metered_until == end
    again = meter(_task(metered_until=end, finished_at=end), end + timedelta(hours=9))
    assert again.charges == [] and again.metered_until == end  # the same period twice charges once


def test_periods_are_cut_at_month_starts() -> None:
    assert month_segments(T0, T0 + timedelta(hours=2)) == [
        (T0, datetime(2026, 12, 1, tzinfo=UTC)),
        (datetime(2026, 12, 1, tzinfo=UTC), T0 + timedelta(hours=2)),
    ]
    got = meter(_task(finished_at=T0 + timedelta(hours=2)), T0)
    assert [c.period_start.month for c in got.charges] == [11, 12]
    assert month_bounds("2026-12") == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    for bad in ("2026-13", "2026-1", "26-01", "1969-12", "2026-00", ""):
        with pytest.raises(ValueError):
            month_bounds(bad)


def test_egress_is_charged_on_new_bytes_only() -> None:
    got = meter(_task(reported_egress_bytes=3_000_000_000), T0 + timedelta(minutes=1))
    (egress,) = [c for c in got.charges if c.kind == "egress"]
    assert (
        egress.amount_micros == 270_000
        and egress.quantity == 3.0
        and got.metered_egress_bytes == 3_000_000_000
    )
    same = meter(_task(metered_until=got.metered_until, metered_egress_bytes=3_000_000_000,
                       reported_egress_bytes=3_000_000_000), T0 + timedelta(minutes=1))  # fmt: skip
    assert same.charges == []


def test_fee_split_and_postings_balance() -> None:
    assert split_fee(1_000_001, 0.1) == (900_001, 100_000)
    assert split_fee(5, 0.1) == (5, 0) and split_fee(7, 1.0) == (0, 7) and split_fee(7, 0.0) == (7, 0)
    posts = charge_postings("gpu", 1_234_567, 0.15, tenant="tenant:t", provider="provider:p")
    assert sum(a for _, a in posts) == 0 and dict(posts)["tenant:t"] == 1_234_567
    posts = charge_postings("egress", 99, 0.15, tenant="tenant:t", provider="provider:p")
    assert posts == [("tenant:t", 99), ("platform:egress", -99)]
    with pytest.raises(ValueError):
        charge_postings("storage", 1, 0.1, tenant="tenant:t", provider="provider:p")
