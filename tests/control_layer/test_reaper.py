"""The reaper marks nodes lost when their liveness key expired, once, only as the current leader, and
not before it has been up for its start-up grace."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from contracts.states import JobState
from control_layer.jobs import job_tasks
from control_layer.placer import place_pending
from control_layer.reaper import Stalls, is_lost, reap_once, run_reaper
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Node
from orchestration.leadership import SINGLETONS, Deposed, fenced, install_fence, read_lease, try_acquire
from orchestration.settings import Settings
from resource_layer.liveness import node_alive_key
from resource_layer.registry import heartbeat
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec


def _fleet(ctx: ServerContext) -> tuple[str, list[str]]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        _, nodes = add_cluster(s, nodes=3, devices_per_node=1)
        # the last recorded heartbeat is old: only the liveness key can vouch for these nodes
        s.execute(update(Node).values(last_heartbeat_at=utcnow() - timedelta(minutes=5)))
        return tenant.id, [n.id for n in nodes]


def _status(ctx: ServerContext, node_id: str) -> str:
    with session_scope(ctx.session_factory) as s:
        node = s.get(Node, node_id)
        assert node is not None
        return node.status


def test_nodes_without_heartbeats_are_lost_and_their_jobs_replaced(ctx: ServerContext) -> None:
    tenant, (a, b, c) = _fleet(ctx)
    job = submit_and_place(ctx, tenant, spec=tiny_spec())
    with session_scope(ctx.session_factory) as s:
        (task,) = job_tasks(s, job.id)
    ttl = ctx.settings.node_lost_after_s
    for node_id in (a, b, c):
        if node_id != task.node_id:
            ctx.bus.touch(node_alive_key(node_id), 60)
    ctx.bus.touch(node_alive_key(task.node_id), ttl)
    assert reap_once(ctx) == []  # every key is fresh
    time.sleep(ttl + 0.1)
    assert reap_once(ctx) == [task.node_id]
    assert _status(ctx, task.node_id) == "lost"
    assert {_status(ctx, n) for n in (a, b, c) if n != task.node_id} == {"alive"}
    with session_scope(ctx.session_factory) as s:
        stored = s.get(Job, job.id)
        # the reaper only detects: the job waits, devices freed, for the placer
        assert stored is not None and (stored.status, stored.attempt) == (JobState.PENDING, 1)
        assert "node lost" in stored.reason
    assert reap_once(ctx) == []  # lost once, not again
    assert place_pending(ctx) == [job.id]
    with session_scope(ctx.session_factory) as s:
        stored = s.get(Job, job.id)
        assert stored is not None and (stored.status, stored.attempt) == (JobState.PLACED, 2)


def test_recent_heartbeat_in_the_database_gives_grace(ctx: ServerContext) -> None:
    _, nodes = _fleet(ctx)
    with session_scope(ctx.session_factory) as s:
        s.execute(update(Node).where(Node.id == nodes[0]).values(last_heartbeat_at=utcnow()))
    # no keys at all (e.g. a control plane just restarted with an in-process bus)
    assert set(reap_once(ctx)) == set(nodes[1:])
    assert _status(ctx, nodes[0]) == "alive"


def test_a_deposed_leaders_reaper_changes_nothing(ctx: ServerContext) -> None:
    _, nodes = _fleet(ctx)
    install_fence(ctx.session_factory)
    old = try_acquire(ctx.session_factory, SINGLETONS, "a", None)
    assert old is not None
    with ctx.session_factory() as s:
        view = read_lease(s, SINGLETONS)
    assert try_acquire(ctx.session_factory, SINGLETONS, "b", view) == old + 1  # "b" takes over
    with fenced(SINGLETONS, old), pytest.raises(Deposed):
        reap_once(ctx)
    assert {_status(ctx, n) for n in nodes} == {"alive"}
    with fenced(SINGLETONS, old + 1):
        assert set(reap_once(ctx)) == set(nodes)


def test_run_reaper_loop_stops_on_request(ctx: ServerContext) -> None:
    _, nodes = _fleet(ctx)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(run_reaper(ctx, stop))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and await asyncio.to_thread(_status, ctx, nodes[0]) != "lost":
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())
    assert {_status(ctx, n) for n in nodes} == {"lost"}


def test_a_stalled_control_plane_does_not_count_its_own_silence_against_nodes(ctx: ServerContext) -> None:
    """The reaper's loop runs nothing for longer than the loss threshold (a starved process): the
    heartbeats of that time were never read, so no node is lost for them; without the stall
    counted, the same silence loses every node."""
    _, nodes = _fleet(ctx)
    plane = ServerContext(  # a 2 s threshold: room for this host's own jitter beside the stall
        settings=ctx.settings.model_copy(update={"heartbeat_misses": 10}),
        session_factory=ctx.session_factory,
        bus=ctx.bus,
    )
    lost_after = plane.settings.node_lost_after_s
    stalls = Stalls(horizon_s=60.0)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(run_reaper(plane, stop, stalls=stalls))
        await asyncio.sleep(plane.settings.heartbeat_interval_s)  # a pass or more, on time
        await asyncio.to_thread(_heard_now, plane)
        time.sleep(lost_after + 0.5)  # the loop is held: the process runs nothing else meanwhile
        for _ in range(3):
            await asyncio.sleep(0.01)  # the loop watcher's next tick finds itself late
        stop.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())
    assert stalls.since(utcnow() - timedelta(minutes=1)) >= lost_after  # late by the hold, less a wait
    assert reap_once(plane, stalls=stalls) == []
    assert {_status(ctx, n) for n in nodes} == {"alive"}
    assert set(reap_once(plane)) == set(nodes)


def _heard_now(ctx: ServerContext) -> None:
    with session_scope(ctx.session_factory) as s:
        s.execute(update(Node).values(last_heartbeat_at=utcnow()))


def test_is_lost_waits_out_the_start_up_grace() -> None:
    now = utcnow()
    old = now - timedelta(seconds=60)
    rule = {"grace_s": 10.0, "now": now, "lost_after_s": 6.0}
    assert not is_lost(up_for_s=9.9, key_alive=False, last_heard=old, **rule)  # just restarted
    assert is_lost(up_for_s=10.0, key_alive=False, last_heard=old, **rule)
    assert not is_lost(up_for_s=100.0, key_alive=True, last_heard=old, **rule)  # key vouches
    recent = now - timedelta(seconds=5)
    assert not is_lost(up_for_s=100.0, key_alive=False, last_heard=recent, **rule)  # row vouches
    # silent 8 s, 3 of them while the control plane itself could not run: 5 s counted
    silent = now - timedelta(seconds=8)
    assert is_lost(up_for_s=100.0, key_alive=False, last_heard=silent, **rule)
    assert not is_lost(up_for_s=100.0, key_alive=False, last_heard=silent, stalled_s=3.0, **rule)


def test_stalls_count_after_a_nodes_last_heartbeat_only() -> None:
    t0 = utcnow()
    stalls = Stalls(horizon_s=60.0)
    stalls.add(t0 + timedelta(seconds=1), 2.0)
    stalls.add(t0 + timedelta(seconds=10), 0.5)
    assert stalls.since(t0) == 2.5 and stalls.since(t0 + timedelta(seconds=5)) == 0.5
    stalls.add(t0 + timedelta(seconds=100), 1.0)  # the first two are past the horizon now
    assert stalls.since(t0) == 1.0


def test_a_restarted_reaper_spares_nodes_that_reconnect_within_the_grace(ctx: ServerContext) -> None:
    """Every key expired and every recorded heartbeat old, as after a control-plane restart: nobody is
    lost during the grace, nodes heard in it survive it, and the silent one is lost right after."""
    tenant, nodes = _fleet(ctx)
    job = submit_and_place(ctx, tenant, spec=tiny_spec())
    with session_scope(ctx.session_factory) as s:
        (task,) = job_tasks(s, job.id)
    grace = ctx.settings.reaper_grace_s
    assert grace >= 2 * ctx.settings.node_lost_after_s
    assert reap_once(ctx, up_for_s=0.0) == []
    assert reap_once(ctx, up_for_s=grace - 0.01) == []
    assert {_status(ctx, n) for n in nodes} == {"alive"}
    silent = next(n for n in nodes if n != task.node_id)
    for node_id in nodes:
        if node_id != silent:
            heartbeat(ctx, node_id)  # reconnected and heard since the restart
    assert reap_once(ctx, up_for_s=grace) == [silent]
    assert _status(ctx, task.node_id) == "alive"
    with session_scope(ctx.session_factory) as s:
        stored = s.get(Job, job.id)
        assert stored is not None and stored.status != JobState.PENDING and stored.attempt == 1


def test_default_grace_outlasts_the_loss_threshold() -> None:
    settings = Settings(heartbeat_interval_s=2.0, heartbeat_misses=3)
    assert settings.reaper_grace_s == 2 * 6.0 + 2 * 2.0
    assert Settings(restart_grace_s=30.0).reaper_grace_s == 30.0
