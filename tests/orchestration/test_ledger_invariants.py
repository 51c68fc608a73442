"""The ledger's invariants on PostgreSQL, over random histories of jobs and their tasks: tasks of
several attempts starting and ending at random times, egress reported as they run, the meter loop
passing at random moments (repeated, and two replicas' passes at once). Whatever happened:

- every transaction's postings sum to zero, and so do all postings together;
- each ended job's charges equal its actual cost, and that is exactly each task's device time at
  its locked-in price plus its egress, each rounded once to micro-units;
- metering the same period again charges nothing;
- the provider and the platform are credited exactly what the tenant is debited.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from contracts.states import JobState, TaskState
from control_layer.metering import meter_once
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, LedgerTransaction, Task
from orchestration.ledger import (
    account_balance,
    close_job,
    job_charges,
    postings_total,
    unbalanced_transactions,
)
from orchestration.ledger.postings import FEES, MICROS, device_micros, egress_micros
from tests.orchestration.fleet import add_cluster, add_tenant

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # histories cross a month start


@dataclass(frozen=True)
class TaskPlan:
    attempt: int
    devices: int
    price: float
    egress_price: float
    start_ms: int
    run_ms: int
    bytes_steps: tuple[int, ...]  # cumulative bytes grow by these, reported along the run


task_plans = st.builds(
    TaskPlan,
    attempt=st.integers(1, 3),
    devices=st.integers(1, 4),
    price=st.sampled_from([0.0, 0.37, 1.0, 2.4, 3.333333]),
    egress_price=st.sampled_from([0.0, 0.02, 0.09]),
    start_ms=st.integers(0, 5 * 3600_000),
    run_ms=st.integers(0, 3 * 3600_000),
    bytes_steps=st.lists(st.integers(0, 3 * 10**9), max_size=4).map(tuple),
)
histories = st.tuples(
    st.lists(task_plans, min_size=1, max_size=4),
    st.lists(st.integers(0, 9 * 3600_000), max_size=8),  # when the meter loop passes (ms)
    st.sampled_from([0.0, 0.1, 0.25]),  # the platform fee at placement
)


@pytest.fixture
def fleet(ctx: ServerContext) -> dict[str, str]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        eu, (eu_node,) = add_cluster(s, region="eu-west", provider="lumen", devices_per_node=4)
        us, (us_node,) = add_cluster(s, region="us-east", provider="atlas", devices_per_node=4)
        return {"tenant": tenant.id, "eu": eu.id, "eu_node": eu_node.id, "us": us.id, "us_node": us_node.id}


def _balances(ctx: ServerContext, tenant_id: str) -> dict[str, int]:
    with ctx.session_factory() as s:
        names = (f"tenant:{tenant_id}", "provider:lumen", "provider:atlas", FEES, "platform:egress")
        return {n: account_balance(s, n) for n in names}


def _replay(
    ctx: ServerContext, fleet: dict[str, str], plans: list[TaskPlan], meters: list[int], fee: float
) -> str:
    """Play the history in time order; returns the job's id (ended and closed)."""
    with session_scope(ctx.session_factory) as s:
        job = Job(tenant_id=fleet["tenant"], name="h", spec={}, status=JobState.RUNNING, attempt=3)
        s.add(job)
        s.flush()
        job_id, task_ids = job.id, []
        for i, p in enumerate(plans):
            eu = i % 2 == 0
            t = Task(
                job_id=job.id,
                attempt=p.attempt,
                cluster_id=fleet["eu" if eu else "us"],
                node_id=fleet["eu_node" if eu else "us_node"],
                region="eu-west" if eu else "us-east",
                status=TaskState.DISPATCHED,
                device_indices=list(range(p.devices)),
                placement=[],
                worker_config={},
                price_per_device_hour=p.price,
                egress_price_per_gb=p.egress_price,
                platform_fee=fee,
            )
            s.add(t)
            s.flush()
            task_ids.append(t.id)

    # (time, order, what, task index, value): starts before reports before meters before ends at one time
    events: list[tuple[int, int, str, int, int]] = []
    for i, p in enumerate(plans):
        events.append((p.start_ms, 0, "start", i, 0))
        sent = 0
        for k, step in enumerate(p.bytes_steps):
            sent += step
            events.append((p.start_ms + (k + 1) * p.run_ms // (len(p.bytes_steps) + 1), 1, "report", i, sent))
        events.append((p.start_ms + p.run_ms, 3, "end", i, sent))
    events += [(m, 2, "meter", -1, 0) for m in meters]
    for at, _, what, i, value in sorted(events):
        now = T0 + timedelta(milliseconds=at)
        if what == "meter":
            meter_once(ctx, now)
            meter_once(ctx, now)  # a retried pass charges nothing more
            continue
        with session_scope(ctx.session_factory) as s:
            t = s.get(Task, task_ids[i])
            if what == "start":
                t.started_at, t.status = now, TaskState.RUNNING
            elif what == "report":
                t.last_metrics = {"step": 1, "wan_bytes_sent": value}
            else:
                t.finished_at, t.status = now, TaskState.SUCCEEDED
                t.result = {"wan_bytes_sent": value}
    with session_scope(ctx.session_factory) as s:
        job = s.scalars(select(Job).where(Job.id == job_id).with_for_update()).one()
        job.status = JobState.SUCCEEDED
        close_job(s, job)
        close_job(s, job)  # closing twice charges once
    return job_id


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories)
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_random_histories_keep_the_ledger_balanced_and_exact(
    ctx: ServerContext, fleet: dict[str, str], history: tuple[list[TaskPlan], list[int], float]
) -> None:
    plans, meters, fee = history
    before = _balances(ctx, fleet["tenant"])
    job_id = _replay(ctx, fleet, plans, meters, fee)
    after = _balances(ctx, fleet["tenant"])
    with ctx.session_factory() as s:
        assert unbalanced_transactions(s) == []
        assert postings_total(s) == 0
        job = s.get(Job, job_id)
        charged = job_charges(s, job_id)
        gpu = sum(
            s.scalars(
                select(LedgerTransaction.amount_micros).where(
                    LedgerTransaction.job_id == job_id, LedgerTransaction.kind == "gpu"
                )
            )
        )
    expected_gpu = sum(device_micros(p.price, p.devices, timedelta(milliseconds=p.run_ms)) for p in plans)
    expected_egress = sum(egress_micros(p.egress_price, sum(p.bytes_steps)) for p in plans)
    assert job.actual_cost == charged == (expected_gpu + expected_egress) / MICROS
    assert gpu == expected_gpu
    delta = {k: after[k] - before[k] for k in after}
    assert delta[f"tenant:{fleet['tenant']}"] == expected_gpu + expected_egress
    assert delta["provider:lumen"] + delta["provider:atlas"] + delta[FEES] == -expected_gpu
    assert delta["platform:egress"] == -expected_egress


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_replicas_metering_at_once_charge_once(ctx: ServerContext, fleet: dict[str, str]) -> None:
    """Two passes of the meter at the same moment, as two replicas might run them: each job's row
    lock makes them take turns, and the second finds nothing left to charge."""
    with session_scope(ctx.session_factory) as s:
        job = Job(tenant_id=fleet["tenant"], name="r", spec={}, status=JobState.RUNNING, attempt=1)
        s.add(job)
        s.flush()
        for _ in range(3):
            s.add(
                Task(
                    job_id=job.id,
                    attempt=1,
                    cluster_id=fleet["eu"],
                    node_id=fleet["eu_node"],
                    region="eu-west",
                    status=TaskState.RUNNING,
                    device_indices=[0, 1],
                    placement=[],
                    worker_config={},
                    price_per_device_hour=1.5,
                    started_at=T0,
                )  # fmt: skip
            )
        job_id = job.id
    now = T0 + timedelta(hours=1)
    barrier = threading.Barrier(4)
    written: list[int] = []

    def run() -> None:
        barrier.wait()
        written.append(meter_once(ctx, now))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(written) == [0, 0, 0, 3]
    with ctx.session_factory() as s:
        assert job_charges(s, job_id) == 3 * 2 * 1.5
        assert unbalanced_transactions(s) == []
