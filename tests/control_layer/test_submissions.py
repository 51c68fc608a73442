"""Submission in groups: ``store_jobs`` stores a batch as one after another would, and the
batcher gathers concurrent submissions into few transactions without mixing up their answers."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from sqlalchemy import func, select

from contracts.errors import NotFound, PaymentRequired
from contracts.states import JobState
from control_layer.submissions import JobDraft, SubmissionBatcher, draft_job, store_jobs
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Event, Job
from tests.orchestration.fleet import add_tenant, tiny_spec


def _tenant(ctx: ServerContext, name: str, cap: float | None = None) -> str:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s, name)
        tenant.max_monthly_spend = cap
        return tenant.id


def _draft(ctx: ServerContext, tenant_id: str, priority: int = 0, cost: float | None = None) -> JobDraft:
    spec = tiny_spec(f"p{priority}", qos={"priority": priority})
    return dataclasses.replace(draft_job(ctx, tenant_id, spec=spec), estimated_cost=cost)


def test_the_draft_is_the_row_column_for_column() -> None:
    assert {f.name for f in dataclasses.fields(JobDraft)} == {c.key for c in Job.__table__.columns}


def test_a_batch_is_stored_as_one_after_another(ctx: ServerContext) -> None:
    alice = _tenant(ctx, "alice")
    capped = _tenant(ctx, "capped", cap=1.0)
    drafts = [
        _draft(ctx, alice, priority=0),
        _draft(ctx, capped, cost=0.6),
        _draft(ctx, alice, priority=5),
        _draft(ctx, capped, cost=0.6),  # 0.6 + 0.6 > 1.0: the one before it in the batch counts
        _draft(ctx, "no-such-tenant"),
        _draft(ctx, alice, priority=0),
    ]
    out = store_jobs(ctx, drafts)

    assert isinstance(out[3], PaymentRequired) and out[3].details["month_spend"] == pytest.approx(0.6)
    assert isinstance(out[4], NotFound) and out[4].details["field"] == "tenant_id"
    stored = [o for o in out if isinstance(o, JobDraft)]
    assert [o.id for o in stored] == [drafts[i].id for i in (0, 1, 2, 5)]
    # Behind every queued job of higher or equal priority, in the order they came.
    assert [o.queue_position for o in stored] == [1, 2, 1, 4]
    with session_scope(ctx.session_factory) as s:
        rows = {j.id: j for j in s.scalars(select(Job))}
        assert set(rows) == {o.id for o in stored}
        assert all(rows[o.id].status == JobState.QUEUED for o in stored)
        assert {rows[o.id].queue_position for o in stored} == {1, 2, 4}
        events = s.execute(select(Event.job_id).where(Event.kind == "job.submitted").order_by(Event.id))
        assert [e for (e,) in events] == [o.id for o in stored]

    # The next batch lands behind what is queued now.
    later = store_jobs(ctx, [_draft(ctx, alice, priority=5), _draft(ctx, alice, priority=9)])
    assert [o.queue_position for o in later if isinstance(o, JobDraft)] == [2, 1]


def test_concurrent_submissions_share_transactions(ctx: ServerContext) -> None:
    alice = _tenant(ctx, "alice")
    capped = _tenant(ctx, "broke", cap=0.0)  # its jobs are refused for the cap

    async def burst() -> tuple[list[JobDraft | BaseException], int]:
        batcher = SubmissionBatcher(ctx)
        drafts = [_draft(ctx, capped if i % 10 == 3 else alice, cost=0.5) for i in range(60)]
        first = asyncio.ensure_future(batcher.submit(drafts[0]))
        while batcher.batches == 0:  # its transaction is in flight (in a thread) ...
            await asyncio.sleep(0)
        # ... while the other 59 arrive: they wait for it, then go in one transaction together
        rest = asyncio.gather(*(batcher.submit(d) for d in drafts[1:]), return_exceptions=True)
        answers = [await first, *await rest]
        await batcher.close()
        return answers, batcher.batches

    answers, batches = asyncio.run(burst())
    refused = [a for a in answers if isinstance(a, BaseException)]
    stored = [a for a in answers if isinstance(a, JobDraft)]
    assert len(refused) == 6 and all(isinstance(a, PaymentRequired) for a in refused)
    assert len(stored) == 54
    assert batches == 2
    assert sorted(a.queue_position or 0 for a in stored) == list(range(1, 55))
    with session_scope(ctx.session_factory) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 54
