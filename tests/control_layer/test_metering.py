"""The meter loop's pass: live jobs' running tasks are charged up to now, ended tasks up to their end
once, and ended jobs (closed at their end) not at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from contracts.states import JobState, TaskState
from control_layer.metering import meter_once
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, LedgerTransaction, Task
from orchestration.ledger import job_charges
from tests.orchestration.fleet import add_cluster, add_tenant


def test_a_pass_charges_live_jobs_up_to_now_and_ended_tasks_once(ctx: ServerContext) -> None:
    start = datetime(2026, 11, 10, 12, tzinfo=UTC)  # no month start inside: one period per meter
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        cluster, (node,) = add_cluster(s, region="eu-west", provider="lumen")
        jobs = {}
        for name, status in (
            ("live", JobState.RUNNING),
            ("queued", JobState.PENDING),
            ("ended", JobState.SUCCEEDED),
        ):
            job = Job(tenant_id=tenant.id, name=name, spec={}, status=status, attempt=1)
            s.add(job)
            s.flush()
            jobs[name] = job.id
            ended = name != "live"
            s.add(
                Task(
                    job_id=job.id,
                    attempt=1,
                    cluster_id=cluster.id,
                    node_id=node.id,
                    region="eu-west",
                    status=TaskState.SUCCEEDED if ended else TaskState.RUNNING,
                    device_indices=[0],
                    placement=[],
                    worker_config={},
                    price_per_device_hour=3.6,
                    started_at=start,
                    finished_at=start + timedelta(minutes=30) if ended else None,
                )  # fmt: skip
            )
    now = start + timedelta(minutes=50)
    assert meter_once(ctx, now) == 2  # the live task up to now, the queued job's old task up to its end
    assert meter_once(ctx, now) == 0
    with ctx.session_factory() as s:
        assert job_charges(s, jobs["live"]) == 3.0  # 50 min x 3.6 / h
        assert job_charges(s, jobs["queued"]) == 1.8
        assert job_charges(s, jobs["ended"]) == 0.0  # an ended job was closed by its end, not by the loop
    assert meter_once(ctx, now + timedelta(minutes=10)) == 1
    with ctx.session_factory() as s:
        assert job_charges(s, jobs["live"]) == 3.6
        periods = s.execute(
            select(LedgerTransaction.period_start, LedgerTransaction.period_end)
            .where(LedgerTransaction.job_id == jobs["live"])
            .order_by(LedgerTransaction.id)
        ).all()
    assert periods[0][1] == periods[1][0]  # meters follow each other without gap or overlap
