"""Many jobs racing for scarce devices never double-book: every device has at most one active
allocation, and every job that got none is still queued with the reason it waits: none fails for
want of free devices."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import func, select

from contracts.errors import NoFeasiblePlan
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Accelerator, Allocation, Job, Task
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, submit_and_place, tiny_spec

SUBMISSIONS = 50


@pytest.mark.slow
def test_concurrent_submissions_never_double_book(ctx: ServerContext) -> None:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s).id
        add_cluster(s, region="eu-west", name="eu1", nodes=2, devices_per_node=2, price=1.0)
        add_cluster(s, region="us-east", name="us1", nodes=2, devices_per_node=2, price=1.5)
        add_link(s, "eu-west", "us-east")
    spec = tiny_spec(parallelism={"dp": 2})  # 8 devices, 2 a job: room for 4 of the 50
    refused: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(SUBMISSIONS)

    def submit(i: int) -> None:
        try:
            start.wait()
            submit_and_place(ctx, tenant, spec=spec)
        except NoFeasiblePlan as exc:  # the fleet was already full when it looked
            refused.append(exc.message)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(SUBMISSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]

    with session_scope(ctx.session_factory) as s:
        per_device = Counter(
            s.scalars(select(Allocation.accelerator_id).where(Allocation.active.is_(True))).all()
        )
        assert per_device and max(per_device.values()) == 1, "a device is held twice"
        assert len(per_device) <= s.scalar(select(func.count()).select_from(Accelerator))
        jobs = s.scalars(select(Job)).all()
        assert len(jobs) + len(refused) == SUBMISSIONS
        by_status = Counter(j.status for j in jobs)
        assert set(by_status) <= {"placed", "queued"}
        assert 1 <= by_status["placed"] <= 4
        for job in jobs:
            held = s.scalars(
                select(Allocation.accelerator_id).where(
                    Allocation.job_id == job.id, Allocation.active.is_(True)
                )
            ).all()
            if job.status == "placed":
                assert len(held) == 2
                tasks = s.scalars(select(Task).where(Task.job_id == job.id)).all()
                assert sum(len(t.device_indices) for t in tasks) == 2
            else:
                assert held == [] and job.deferred, (job.status, job.deferred)
        # the fleet is full: whoever was turned away was turned away for want of devices
        assert by_status["placed"] == 4 or by_status["queued"] > 0
