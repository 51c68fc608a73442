"""The placer loop: woken by submission on the bus (not only its poll), only on the current leader."""

from __future__ import annotations

import asyncio
import time

import pytest

from contracts.states import JobState
from control_layer.jobs import submit_job
from control_layer.placer import place_pending, run_placer
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job
from orchestration.leadership import SINGLETONS, Deposed, fenced, install_fence, read_lease, try_acquire
from tests.orchestration.fleet import add_cluster, add_tenant, tiny_spec


def _status(ctx: ServerContext, job_id: str) -> str:
    with session_scope(ctx.session_factory) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status


def test_submission_wakes_the_placer_long_before_its_poll(ctx: ServerContext) -> None:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s).id
        add_cluster(s, region="eu-west", name="c1", nodes=1, devices_per_node=2, price=1.0)

    async def main() -> float:
        stop = asyncio.Event()
        loop = asyncio.create_task(run_placer(ctx, stop, interval_s=600))
        await asyncio.sleep(0.3)  # first (empty) pass done; now only a wake-up can bring the next
        start = time.monotonic()
        job = await asyncio.to_thread(submit_job, ctx, tenant, spec=tiny_spec())
        while await asyncio.to_thread(_status, ctx, job.id) == JobState.QUEUED:
            assert time.monotonic() - start < 20, "the placer was not woken"
            await asyncio.sleep(0.05)
        stop.set()
        await loop
        assert await asyncio.to_thread(_status, ctx, job.id) == JobState.PLACED
        return time.monotonic() - start

    assert asyncio.run(main()) < 20


def test_a_deposed_leaders_placer_places_nothing(ctx: ServerContext) -> None:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s).id
        add_cluster(s, region="eu-west", name="c1", nodes=1, devices_per_node=2, price=1.0)
    job = submit_job(ctx, tenant, spec=tiny_spec())
    old = try_acquire(ctx.session_factory, SINGLETONS, "a", None)
    assert old is not None
    with ctx.session_factory() as s:
        view = read_lease(s, SINGLETONS)
    assert try_acquire(ctx.session_factory, SINGLETONS, "b", view) == old + 1
    install_fence(ctx.session_factory)
    with fenced(SINGLETONS, old), pytest.raises(Deposed):
        place_pending(ctx)
    assert _status(ctx, job.id) == JobState.QUEUED
    with fenced(SINGLETONS, old + 1):
        assert place_pending(ctx) == [job.id]
    assert _status(ctx, job.id) == JobState.PLACED
