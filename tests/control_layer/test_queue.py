"""The admission queue on a real database: queued not failed, order, fair share, head of line,
quotas, the 402 spend cap and the preemption hook, all through real allocation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from contracts.errors import PaymentRequired
from contracts.states import JobState
from control_layer.jobs import cancel_job, create_quote, submit_job
from control_layer.lifecycle import transition
from control_layer.placer import NONE_FREE, place_pending
from control_layer.victim_choice import NOT_PREEMPTIBLE
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Allocation, Job, Node, Tenant
from tests.orchestration.fleet import add_cluster, add_tenant, hold_devices, tiny_spec


def _fleet(ctx: ServerContext, devices: int = 2) -> tuple[str, str]:
    """alice and bob; one node of ``devices`` devices."""
    with session_scope(ctx.session_factory) as s:
        alice, bob = add_tenant(s, "alice"), add_tenant(s, "bob")
        add_cluster(s, region="eu-west", name="c1", nodes=1, devices_per_node=devices, price=1.0)
        return alice.id, bob.id


def _spec(name: str, dp: int, priority: int = 0, preemptible: bool = False):
    return tiny_spec(name, parallelism={"dp": dp}, qos={"priority": priority, "preemptible": preemptible})


def _job(ctx: ServerContext, job_id: str) -> Job:
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _devices(ctx: ServerContext, job_id: str) -> int:
    with session_scope(ctx.session_factory) as s:
        return len(
            s.scalars(
                select(Allocation).where(Allocation.job_id == job_id, Allocation.active.is_(True))
            ).all()
        )


def test_a_job_that_does_not_fit_now_waits_queued_and_runs_when_devices_free(ctx: ServerContext) -> None:
    alice, _ = _fleet(ctx)
    first = submit_job(ctx, alice, spec=_spec("first", 2))
    second = submit_job(ctx, alice, spec=_spec("second", 2))
    assert (first.queue_position, second.queue_position) == (1, 2)
    place_pending(ctx)
    assert _job(ctx, first.id).status == JobState.PLACED and _devices(ctx, first.id) == 2
    waiting = _job(ctx, second.id)
    assert waiting.status == JobState.QUEUED and _devices(ctx, second.id) == 0
    assert waiting.queue_position == 1 and waiting.deferred.startswith("waiting for devices")
    place_pending(ctx)  # nothing freed: still waiting, never failed
    assert _job(ctx, second.id).status == JobState.QUEUED
    cancel_job(ctx, first.id, "done with it")
    place_pending(ctx)
    placed = _job(ctx, second.id)
    assert placed.status == JobState.PLACED and _devices(ctx, second.id) == 2
    assert (placed.queue_position, placed.deferred) == (None, None)


def test_higher_priority_is_admitted_first(ctx: ServerContext) -> None:
    alice, _ = _fleet(ctx)
    low = submit_job(ctx, alice, spec=_spec("low", 2, priority=0))
    high = submit_job(ctx, alice, spec=_spec("high", 2, priority=5))
    assert high.queue_position == 1  # ahead of the earlier job of lower priority at submission
    place_pending(ctx)
    assert _job(ctx, high.id).status == JobState.PLACED
    assert _job(ctx, low.id).status == JobState.QUEUED


def test_fair_share_favours_the_tenant_holding_fewer_devices(ctx: ServerContext) -> None:
    alice, bob = _fleet(ctx, devices=3)
    with session_scope(ctx.session_factory) as s:
        node = s.scalars(select(Node)).one()
        hold_devices(s, s.get(Tenant, alice), node, [0, 1])  # alice already holds two of three
    alice_job = submit_job(ctx, alice, spec=_spec("alices", 1))
    bob_job = submit_job(ctx, bob, spec=_spec("bobs", 1))  # later, but bob holds nothing
    place_pending(ctx)
    assert _job(ctx, bob_job.id).status == JobState.PLACED
    assert _job(ctx, alice_job.id).status == JobState.QUEUED


@pytest.mark.parametrize("strategy", ["best_effort_fifo", "strict_fifo"])
def test_head_of_line(ctx: ServerContext, strategy: str) -> None:
    alice, _ = _fleet(ctx, devices=2)
    ctx.settings.queue_strategy = strategy
    blocker = submit_job(ctx, alice, spec=_spec("blocker", 1))
    place_pending(ctx)  # one device left
    big = submit_job(ctx, alice, spec=_spec("big", 2))
    small = submit_job(ctx, alice, spec=_spec("small", 1))
    place_pending(ctx)
    assert _job(ctx, big.id).status == JobState.QUEUED
    if strategy == "best_effort_fifo":  # the small job passes the big one that cannot fit
        assert _job(ctx, small.id).status == JobState.PLACED
        assert _job(ctx, big.id).queue_position == 1
    else:  # nothing overtakes the head
        held = _job(ctx, small.id)
        assert held.status == JobState.QUEUED and f"behind job {big.id}" in held.deferred
        assert (_job(ctx, big.id).queue_position, held.queue_position) == (1, 2)
    cancel_job(ctx, blocker.id, "make room")
    place_pending(ctx)
    assert _job(ctx, big.id).status == JobState.PLACED or _job(ctx, small.id).status == JobState.PLACED


def test_a_job_over_its_tenants_device_quota_waits_naming_the_numbers(ctx: ServerContext) -> None:
    alice, _ = _fleet(ctx)
    with session_scope(ctx.session_factory) as s:
        s.get(Tenant, alice).max_devices = 1
    big = submit_job(ctx, alice, spec=_spec("big", 2))
    small = submit_job(ctx, alice, spec=_spec("small", 1))
    place_pending(ctx)
    waiting = _job(ctx, big.id)
    assert waiting.status == JobState.QUEUED
    assert "0 in use + 2 requested > max_devices 1" in waiting.deferred
    assert _job(ctx, small.id).status == JobState.PLACED
    another = submit_job(ctx, alice, spec=_spec("another", 1))
    place_pending(ctx)
    assert "1 in use" in _job(ctx, another.id).deferred and _devices(ctx, another.id) == 0


def test_a_submission_over_the_monthly_spend_cap_is_refused_with_the_numbers(ctx: ServerContext) -> None:
    alice, _ = _fleet(ctx)
    quote = create_quote(ctx, alice, _spec("quoted", 1))
    estimate = quote.options[0]["estimates"]["cost"]["total"]
    with session_scope(ctx.session_factory) as s:
        s.get(Tenant, alice).max_monthly_spend = 1.0
        now = utcnow()
        s.add(  # a job that ended this month and cost most of the cap
            Job(
                tenant_id=alice,
                name="old",
                spec={},
                status="succeeded",
                actual_cost=1.0 - estimate / 2,
                finished_at=now,
                created_at=now - timedelta(hours=1),
            )
        )
    before = _count_jobs(ctx)
    with pytest.raises(PaymentRequired) as info:
        submit_job(ctx, alice, quote_id=quote.id)
    details = info.value.details
    assert details["max_monthly_spend"] == 1.0 and details["estimate"] == pytest.approx(estimate, rel=1e-6)
    assert details["month_spend"] == pytest.approx(1.0 - estimate / 2)
    assert _count_jobs(ctx) == before  # nothing stored
    # a spec (no estimate yet) is taken while the month is under the cap, then checked once planned
    job = submit_job(ctx, alice, spec=_spec("spec", 1))
    place_pending(ctx)
    waiting = _job(ctx, job.id)
    assert waiting.status == JobState.QUEUED and "monthly spend cap exceeded" in waiting.deferred


def _count_jobs(ctx: ServerContext) -> int:
    with session_scope(ctx.session_factory) as s:
        return len(s.scalars(select(Job.id)).all())


def test_the_placer_preempts_lower_priority_preemptible_work_through_the_given_mechanism(
    ctx: ServerContext,
) -> None:
    alice, bob = _fleet(ctx)
    low = submit_job(ctx, alice, spec=_spec("low", 1, priority=0, preemptible=True))
    keep = submit_job(ctx, alice, spec=_spec("keep", 1, priority=0, preemptible=False))
    place_pending(ctx)
    calls: list[tuple[str, str | None]] = []

    def preempt(ctx: ServerContext, job_id: str, *, reason: str, by_job_id: str | None) -> bool:
        calls.append((job_id, by_job_id))
        cancel_job(ctx, job_id, reason)  # stands in for checkpoint-stop-requeue: frees the devices
        return True

    ctx.preempt_job = preempt
    urgent = submit_job(ctx, bob, spec=_spec("urgent", 1, priority=10))
    place_pending(ctx)
    assert calls == [(low.id, urgent.id)]  # the preemptible one, never the other
    assert "preempting" in _job(ctx, urgent.id).deferred
    place_pending(ctx)
    assert _job(ctx, urgent.id).status == JobState.PLACED
    assert _job(ctx, keep.id).status == JobState.PLACED


def test_a_requeued_victim_does_not_take_back_the_devices_it_freed(ctx: ServerContext) -> None:
    """The victim is back in the queue with its devices free before the next pass; that pass tries
    the higher priority first, so the job that preempted it gets them, and the victim waits."""
    alice, bob = _fleet(ctx)
    low = submit_job(ctx, alice, spec=_spec("low", 2, priority=0, preemptible=True))
    place_pending(ctx)

    def preempt(ctx: ServerContext, job_id: str, *, reason: str, by_job_id: str | None) -> bool:
        with session_scope(ctx.session_factory) as s:  # stands in for checkpoint-stop-requeue
            victim = s.get(Job, job_id)
            assert victim is not None
            transition(s, ctx.bus, victim, JobState.QUEUED, reason=f"preempted by job {by_job_id}")
        return True

    ctx.preempt_job = preempt
    urgent = submit_job(ctx, bob, spec=_spec("urgent", 2, priority=10))
    place_pending(ctx)  # the victim requeues during the pass that asked for it
    assert _job(ctx, low.id).status == JobState.QUEUED
    place_pending(ctx)
    assert _job(ctx, urgent.id).status == JobState.PLACED and _devices(ctx, urgent.id) == 2
    victim = _job(ctx, low.id)
    assert (victim.status, victim.attempt) == (JobState.QUEUED, 1)
    assert (victim.deferred or "").startswith("waiting for devices")
    cancel_job(ctx, urgent.id, "done")
    place_pending(ctx)
    assert _job(ctx, low.id).status == JobState.PLACED and _job(ctx, low.id).attempt == 2


def test_a_job_that_may_preempt_nothing_on_a_full_fleet_is_told_why(ctx: ServerContext) -> None:
    alice, bob = _fleet(ctx)
    fixed = submit_job(ctx, alice, spec=_spec("fixed", 2, priority=0, preemptible=False))
    place_pending(ctx)
    calls: list[str] = []

    def preempt(ctx: ServerContext, job_id: str, *, reason: str, by_job_id: str | None) -> bool:
        calls.append(job_id)
        return True

    ctx.preempt_job = preempt
    urgent = submit_job(ctx, bob, spec=_spec("urgent", 2, priority=10))
    place_pending(ctx)
    waiting = _job(ctx, urgent.id)
    assert (waiting.status, waiting.deferred) == (JobState.QUEUED, f"{NONE_FREE}; {NOT_PREEMPTIBLE}")
    assert calls == [] and _job(ctx, fixed.id).status == JobState.PLACED
    # a job of the same priority has nothing below it to preempt: the plain reason
    peer = submit_job(ctx, bob, spec=_spec("peer", 1, priority=0))
    place_pending(ctx)
    assert _job(ctx, peer.id).deferred == NONE_FREE
    # with a device free but too few, the planner's answer says the same
    cancel_job(ctx, urgent.id, "next case")
    cancel_job(ctx, fixed.id, "next case")
    place_pending(ctx)  # the peer takes one device of two
    assert _job(ctx, peer.id).status == JobState.PLACED
    wide = submit_job(ctx, bob, spec=_spec("wide", 2, priority=10))
    place_pending(ctx)
    reason = _job(ctx, wide.id).deferred or ""
    assert reason.startswith("waiting for devices: ") and reason.endswith(f"; {NOT_PREEMPTIBLE}"), reason
    assert calls == []


def test_on_a_full_fleet_jobs_wait_unplanned_and_one_that_could_never_fit_still_fails(
    ctx: ServerContext,
) -> None:
    alice, _ = _fleet(ctx)
    holder = submit_job(ctx, alice, spec=_spec("holder", 2))
    place_pending(ctx)
    assert _job(ctx, holder.id).status == JobState.PLACED  # nothing free now
    fits_later = submit_job(ctx, alice, spec=_spec("later", 1))
    never = submit_job(ctx, alice, spec=_spec("never", 3))  # three devices: the fleet has two
    cache: dict = {}
    place_pending(ctx, cache)
    waiting, failed = _job(ctx, fits_later.id), _job(ctx, never.id)
    assert (waiting.status, waiting.deferred) == (JobState.QUEUED, NONE_FREE)
    assert failed.status == JobState.FAILED and "even with every device free" in failed.reason
    assert len(cache) == 2  # each spec answered once for this fleet
