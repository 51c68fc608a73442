"""Ledger: device-hours at the locked-in price plus egress, for every task that ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_layer.allocation import allocate
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, LedgerEntry, Price
from orchestration.ledger import cost_summary, record_job_cost, tenant_spend
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, hand_option, tiny_spec


def test_actual_cost_from_device_hours_and_egress(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        tenant = add_tenant(s)
        eu, (eu_node,) = add_cluster(s, region="eu-west", price=3.0)
        us, (us_node,) = add_cluster(s, region="us-east", price=1.0)
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
        tasks = allocate(s, job, spec, option, attempt=1)
        # a price change after placement does not change what this job pays
        s.add(Price(cluster_id=eu.id, price_per_device_hour=100.0, effective_from=utcnow()))
        start = utcnow() - timedelta(hours=2)
        for t in tasks:
            t.started_at, t.finished_at = start, start + timedelta(hours=1)
            t.last_metrics = {"step": 9, "wan_bytes_sent": 2_000_000_000 if t.region == "eu-west" else 0}
        t_us = next(t for t in tasks if t.region == "us-east")
        t_us.result = {"wan_bytes_sent": 500_000_000}  # the result may carry the final count
        job.started_at, job.finished_at = start, start + timedelta(hours=1)
        total = record_job_cost(s, job)
        job_id, tenant_id = job.id, tenant.id

    # eu: 2 devices x 1 h x 3.0 + 2 GB x 0.1; us: 1 x 1 x 1.0 + 0.5 GB x 0.1
    assert total == pytest.approx(6.0 + 0.2 + 1.0 + 0.05)
    with session_scope(session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.actual_cost == pytest.approx(total)
        assert record_job_cost(s, job) == pytest.approx(total)  # idempotent: no second set of lines
        assert len(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id)).all()) == 4
        summary = cost_summary(s, job)
        assert summary["estimated"]["total"] == 5.0
        assert summary["estimated"]["device_hours"] == pytest.approx(1.5)  # 3 devices x 0.5 h
        assert summary["actual"]["device_hours"] == pytest.approx(3.0)
        assert summary["actual"]["egress_gb"] == pytest.approx(2.5)
        assert summary["actual"]["total"] == pytest.approx(total)
        assert summary["actual"]["duration_s"] == pytest.approx(3600)
        assert tenant_spend(s, tenant_id) == pytest.approx(total)
