"""0016 moves single-entry charge lines into balanced transactions: a ledger written at head, taken
down to 0014 (one line per task and kind) and up again keeps every job's charges, balances, and
closes the meters of ended jobs' tasks so that nothing is charged twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from contracts.states import JobState, TaskState
from orchestration.db.engine import make_engine, make_session_factory, session_scope
from orchestration.db.migrate import downgrade, upgrade
from orchestration.db.models import Job, Task
from orchestration.ledger import (
    account_balance,
    close_job,
    job_charges,
    meter_job,
    postings_total,
    unbalanced_transactions,
)
from tests.orchestration.fleet import add_cluster, add_tenant


def test_charge_lines_become_balanced_transactions(db_url: str) -> None:
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    # No month start inside (a meter splits its charges there): one GPU charge per meter, whenever
    # the test runs (three hours back from now crossed 1 December at 02:00-03:00 UTC).
    start = datetime(2026, 11, 10, 12, tzinfo=UTC)
    with session_scope(factory) as s:
        tenant = add_tenant(s)
        cluster, (node,) = add_cluster(s, region="eu-west", provider="lumen")
        ids = {}
        for name, status in (("done", JobState.SUCCEEDED), ("live", JobState.RUNNING)):
            job = Job(tenant_id=tenant.id, name=name, spec={}, status=status, attempt=1)
            s.add(job)
            s.flush()
            task = Task(job_id=job.id, attempt=1, cluster_id=cluster.id, node_id=node.id, region="eu-west",
                        status=TaskState.RUNNING, device_indices=[0, 1], placement=[], worker_config={},
                        price_per_device_hour=1.5, egress_price_per_gb=0.1, started_at=start,
                        last_metrics={"step": 3, "wan_bytes_sent": 4_000_000_000})  # fmt: skip
            s.add(task)
            s.flush()
            ids[name] = (job.id, task.id)
        done = s.get(Job, ids["done"][0])
        s.get(Task, ids["done"][1]).finished_at = start + timedelta(hours=2)
        close_job(s, done)  # 2 devices x 2 h x 1.5 + 4 GB x 0.1
        tenant_id = tenant.id
    engine.dispose()

    downgrade(db_url, "0014")
    upgrade(db_url)

    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    try:
        with session_scope(factory) as s:
            assert job_charges(s, ids["done"][0]) == 6.4
            assert postings_total(s) == 0 and unbalanced_transactions(s) == []
            assert account_balance(s, f"tenant:{tenant_id}") == 6_400_000
            assert account_balance(s, "provider:lumen") == -5_400_000  # 6.0 less the default 10 %
            assert account_balance(s, "platform:fees") == -600_000
            assert account_balance(s, "platform:egress") == -400_000
            done_task = s.get(Task, ids["done"][1])
            assert done_task.metered_egress_bytes == 4_000_000_000 and done_task.metered_until is not None
            live_task = s.get(Task, ids["live"][1])
            assert live_task.metered_until is None and live_task.metered_egress_bytes == 0
            # nothing more for the ended job; the live one is metered from its start
            assert meter_job(s, s.get(Job, ids["done"][0])) == []
            charged = meter_job(s, s.get(Job, ids["live"][0]), start + timedelta(hours=1))
            assert sorted(t.kind for t in charged) == ["egress", "gpu"]
            assert s.scalar(select(Task.platform_fee).where(Task.id == ids["live"][1])) == 0.1
    finally:
        engine.dispose()
