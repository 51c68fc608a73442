"""The follow loop the event and log streams share, on a real database and bus: keep-alives and
the re-read they bring, live messages passed through or skipped, the end found by a re-read, and
a stop or an early close that lets go of the stream's subscription."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from sqlalchemy import update

from contracts.states import JobState
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import Job
from orchestration.events import job_channel, record_event
from service_layer.fanout import Fanout
from service_layer.sse import job_event_stream
from tests.orchestration.fleet import add_tenant

KEEPALIVE = ": keep-alive\n\n"


def _running_job(ctx: ServerContext) -> tuple[str, str, int]:
    """(tenant id, job id, the id of the one event in its history)."""
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s, "alice")
        job = Job(tenant_id=tenant.id, name="watched", spec={}, status=JobState.RUNNING)
        s.add(job)
        s.flush()
        return tenant.id, job.id, record_event(s, ctx.bus, "job.running", job.id)


async def _next(frames: AsyncIterator[str]) -> str:
    return await asyncio.wait_for(anext(frames), 10)


def test_keepalives_reread_and_the_end_is_found_without_a_message(ctx: ServerContext) -> None:
    tenant_id, job_id, first = _running_job(ctx)

    async def follow() -> list[str]:
        fanout = Fanout(ctx.bus)
        frames = job_event_stream(ctx, fanout, tenant_id, job_id, keepalive_s=0.2)
        got = [await _next(frames)]  # the history, before any wait
        assert await _next(frames) == KEEPALIVE  # nothing live within a keep-alive
        ctx.bus.publish(job_channel(job_id), {"id": first, "kind": "job.running"})  # sent already
        ctx.bus.publish(job_channel(job_id), {"kind": "task.metrics", "step": 7})  # not persisted
        while (frame := await _next(frames)) == KEEPALIVE:
            pass
        got.append(frame)
        # The job ends with no message on the bus: the next keep-alive's re-read finds it.
        with session_scope(ctx.session_factory) as s:
            s.execute(update(Job).where(Job.id == job_id).values(status=JobState.SUCCEEDED))
        got += [frame async for frame in frames if frame != KEEPALIVE]
        await fanout.close()
        return got

    history, metrics, end = asyncio.run(asyncio.wait_for(follow(), 30))
    assert history.startswith(f"id: {first}\ndata: ") and '"kind":"job.running"' in history
    assert metrics == 'data: {"kind":"task.metrics","step":7}\n\n'  # no id: passed straight through
    assert end == 'event: end\ndata: {"status":"succeeded"}\n\n'


def test_a_stop_or_an_early_close_ends_the_stream_and_frees_its_subscription(ctx: ServerContext) -> None:
    tenant_id, job_id, first = _running_job(ctx)

    async def follow() -> list[str]:
        fanout = Fanout(ctx.bus, max_per_tenant=1)  # a second open stream would be refused
        stopping = asyncio.Event()
        frames = job_event_stream(ctx, fanout, tenant_id, job_id, stopping=stopping, keepalive_s=30)
        got = [await _next(frames)]
        stopping.set()
        got += [frame async for frame in frames]  # ends at once: no keep-alive, no end event
        fanout.check_capacity(tenant_id)  # the subscription is released

        frames = job_event_stream(ctx, fanout, tenant_id, job_id, keepalive_s=30)
        got.append(await _next(frames))
        await frames.aclose()  # a client that goes away
        fanout.check_capacity(tenant_id)
        await fanout.close()
        return got

    got = asyncio.run(asyncio.wait_for(follow(), 30))
    assert [json.loads(f.split("data: ", 1)[1])["id"] for f in got] == [first, first]
