"""The in-memory snapshot, kept current row by row from the resource change feed, equals the
fleet read afresh in full (``build_snapshot``: the same builder, every row loaded) after every
kind of change, on SQLite and PostgreSQL, including changes another control-plane context (a
replica) commits: a change the feed misses, or one applied to the wrong rows, shows here."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from contracts.errors import InvalidArgument
from contracts.registration import DeviceReport, NodeRegistration
from control_layer import live_snapshot
from control_layer.allocation import release
from control_layer.live_snapshot import (
    LiveSnapshot,
    attach_live_snapshot,
    detach_live_snapshot,
    run_live_snapshot,
)
from control_layer.planner import plan
from control_layer.reactions import on_node_lost
from control_layer.snapshot import build_snapshot
from orchestration.bus import InProcessBus, RedisBus
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import make_engine, make_session_factory, session_scope
from orchestration.db.models import Cluster, Node, Price, Tenant
from resource_layer.registry import heartbeat, register_node, update_capacity
from resource_layer.tokens import create_enrollment_token
from service_layer.links import upsert_link
from tests.conftest import REDIS_URL
from tests.orchestration.fleet import add_tenant, hold_devices, tiny_spec

REGIONS = ("eu-west", "us-east", "ap-south")


def _plain(snapshot: Any) -> dict[str, Any]:
    data = snapshot.model_dump(mode="json")
    data.pop("taken_at")
    return data


def assert_same(ctx: ServerContext, live: LiveSnapshot, exclude: frozenset[str] = frozenset()) -> None:
    with session_scope(ctx.session_factory) as session:
        expected = _plain(build_snapshot(session, exclude_nodes=exclude))
    assert _plain(live.snapshot(exclude)) == expected


def register(
    ctx: ServerContext,
    region: str,
    cluster: str,
    devices: int,
    price: float,
    *,
    node: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """A real registration (enrollment token, or the node's credentials); returns (id, token)."""
    reports = tuple(DeviceReport(i, "H100", 80.0, 400.0 + i, "cuda") for i in range(devices))
    with session_scope(ctx.session_factory) as session:
        token = ""
        if node is None:
            _, token = create_enrollment_token(session, provider="lumen")
        reg = NodeRegistration(
            region=region,
            cluster=cluster,
            devices=reports,
            price_per_device_hour=price,
            advertise_host="127.0.0.1",
            sync_port_min=20000,
            sync_port_max=20010,
            enrollment_token=token,
            provider="lumen",
            hostname=f"{cluster}-host",
            jurisdiction=region[:2].upper(),
            node_id=node[0] if node else "",
            node_token=node[1] if node else "",
        )
        row, plaintext = register_node(session, reg)
        return row.id, plaintext


@pytest.fixture
def live(ctx: ServerContext) -> Iterator[LiveSnapshot]:
    attached = attach_live_snapshot(ctx)
    yield attached
    detach_live_snapshot(ctx)


# One step of a fleet's life: (what, which node or cluster, a number).
OPS = st.lists(
    st.tuples(
        st.sampled_from(["register", "reregister", "hold", "release", "lose", "revive", "link"]),
        st.integers(0, 5),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_live_snapshot_equals_database_after_any_sequence_of_changes(
    ctx: ServerContext, live: LiveSnapshot, ops: list[tuple[str, int, int]]
) -> None:
    live.snapshot()  # loaded before the changes: from here on it only follows them
    tag = f"h{time.monotonic_ns() % 10**9}"
    nodes = [register(ctx, region, f"{tag}-{region}", 2, 1.0) for region in REGIONS]
    assert_same(ctx, live)
    holders: list[str] = []
    with session_scope(ctx.session_factory) as s:
        tenant_id = add_tenant(s, name=f"t-{tag}").id
    for what, k, n in ops:
        if what == "register":
            region = REGIONS[k % len(REGIONS)]
            nodes.append(register(ctx, region, f"{tag}-c{k % 3}", n, 1.0 + k))
        elif what == "reregister":  # new price, and the node reports a different device count
            node_id, token = nodes[k % len(nodes)]
            with session_scope(ctx.session_factory) as s:
                node = s.get(Node, node_id)
                assert node is not None
                cluster = node.cluster_id
            region, name = _where(ctx, cluster)
            try:
                nodes[k % len(nodes)] = register(ctx, region, name, n + 4, 2.0 + n, node=(node_id, token))
            except (
                Exception
            ) as exc:  # a device with allocation history cannot vanish: refused, nothing changed
                assert "allocation history" in str(exc)
        elif what == "hold":
            node_id, _ = nodes[k % len(nodes)]
            with session_scope(ctx.session_factory) as s:
                node = s.get(Node, node_id)
                assert node is not None
                held = _free_indices(live, node_id)[:n]
                if held:
                    tenant = s.get(Tenant, tenant_id)
                    assert tenant is not None
                    holders.append(hold_devices(s, tenant, node, held).job_id)
        elif what == "release" and holders:
            job_id = holders.pop(k % len(holders))
            with session_scope(ctx.session_factory) as s:
                release(s, job_id)
        elif what == "lose":
            on_node_lost(ctx, nodes[k % len(nodes)][0], "test")
        elif what == "revive":
            heartbeat(ctx, nodes[k % len(nodes)][0], persist=True)
        elif what == "link":
            with session_scope(ctx.session_factory) as s:
                upsert_link(s, REGIONS[k % 3], REGIONS[(k + 1) % 3], float(n), 10.0 * n, 0.01 * n)
        assert_same(ctx, live)
    assert_same(ctx, live, exclude=frozenset({nodes[0][0]}))


def _where(ctx: ServerContext, cluster_id: str) -> tuple[str, str]:
    with session_scope(ctx.session_factory) as s:
        c = s.get(Cluster, cluster_id)
        assert c is not None
        return c.region, c.name


def _free_indices(live: LiveSnapshot, node_id: str) -> list[int]:
    for c in live.snapshot().clusters:
        for n in c.nodes:
            if n.id == node_id:
                return [d.index for d in n.devices if d.free]
    return []


def test_unchanged_clusters_keep_their_objects_and_prices_come_into_force(
    ctx: ServerContext, live: LiveSnapshot
) -> None:
    a, _ = register(ctx, "eu-west", "a", 2, 1.0)
    b, _ = register(ctx, "us-east", "b", 2, 1.0)
    first = {c.name: c for c in live.snapshot().clusters}
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        node = s.get(Node, b)
        assert node is not None
        hold_devices(s, tenant, node, [0])
    second = {c.name: c for c in live.snapshot().clusters}
    assert second["a"] is first["a"]  # re-read only what changed: what the planner derives from "a" holds
    assert second["b"] is not first["b"] and second["b"].n_free == 1
    assert_same(ctx, live)
    # the planner's per-cluster reuse gives what planning from scratch on the database gives
    spec = tiny_spec(qos={"objective": "time"})
    with session_scope(ctx.session_factory) as s:
        fresh = build_snapshot(s)
    for _ in range(2):
        assert [o.model_dump() for o in plan(spec, live.snapshot())] == [
            o.model_dump() for o in plan(spec, fresh)
        ]

    # a price that comes into force later is read when its time comes, with no write to announce it
    with session_scope(ctx.session_factory) as s:
        cluster_a = s.get(Node, a)
        assert cluster_a is not None
        s.add(
            Price(
                cluster_id=cluster_a.cluster_id,
                price_per_device_hour=9.0,
                effective_from=utcnow() + timedelta(seconds=1.0),
            )
        )
    assert {c.name: c.price_per_device_hour for c in live.snapshot().clusters}["a"] == 1.0
    time.sleep(1.1)
    assert {c.name: c.price_per_device_hour for c in live.snapshot().clusters}["a"] == 9.0
    assert_same(ctx, live)

    # a bulk statement nobody attributed to rows makes the next quote read everything
    with session_scope(ctx.session_factory) as s:
        s.execute(update(Node).where(Node.id == a).values(status="drained"))
    assert [c.name for c in live.snapshot().clusters] == ["b"]
    assert_same(ctx, live)


def test_a_scheduler_backed_nodes_unavailable_devices_leave_its_free_ones_out(
    ctx: ServerContext, live: LiveSnapshot
) -> None:
    """A Slurm cluster's agent says how many devices its other users hold now: that many of the
    node's free devices are not free to the planner, whatever cpn itself holds, until it says
    otherwise; a count out of bounds is refused and changes nothing."""
    node_id, _ = register(ctx, "eu-west", "hpc", 4, 1.0)
    with session_scope(ctx.session_factory) as s:
        node = s.get(Node, node_id)
        assert node is not None
        hold_devices(s, add_tenant(s), node, [0])
    assert _free_indices(live, node_id) == [1, 2, 3]
    for unavailable, free in ((2, [1]), (0, [1, 2, 3]), (9, [])):
        with session_scope(ctx.session_factory) as s:
            update_capacity(s, node_id, unavailable)
        assert _free_indices(live, node_id) == free
        assert_same(ctx, live)
    with (
        pytest.raises(InvalidArgument, match=r"capacity.devices_unavailable: -1 is outside"),
        session_scope(ctx.session_factory) as s,
    ):
        update_capacity(s, node_id, -1)
    assert _free_indices(live, node_id) == []
    # The queue wait it reports reaches the planner's node the same way; NaN is refused.
    with session_scope(ctx.session_factory) as s:
        update_capacity(s, node_id, 9, 240.0)
    assert _node(live, node_id).queue_wait_s == 240.0
    assert_same(ctx, live)
    with (
        pytest.raises(InvalidArgument, match=r"capacity.queue_wait_s: nan is not a number of seconds"),
        session_scope(ctx.session_factory) as s,
    ):
        update_capacity(s, node_id, 0, float("nan"))
    assert _node(live, node_id).queue_wait_s == 240.0 and _free_indices(live, node_id) == []


def _node(live: LiveSnapshot, node_id: str) -> Any:
    return next(n for c in live.snapshot().clusters for n in c.nodes if n.id == node_id)


def test_a_change_committed_by_another_replica_reaches_the_live_snapshot(
    ctx: ServerContext, live: LiveSnapshot, db_url: str
) -> None:
    """Replica 2 has its own engine, session factory and bus client: only the bus tells replica 1."""
    bus2 = RedisBus(REDIS_URL, prefix=ctx.bus.prefix) if isinstance(ctx.bus, RedisBus) else ctx.bus
    assert isinstance(bus2, RedisBus | InProcessBus)
    engine2 = make_engine(db_url)
    other = ServerContext(settings=ctx.settings, session_factory=make_session_factory(engine2), bus=bus2)
    stop_loop = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        async def main() -> None:
            task = asyncio.create_task(run_live_snapshot(ctx, stop))
            while not stop_loop.is_set():
                await asyncio.sleep(0.02)
            stop.set()
            await task

        loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert live.listening.wait(10.0), "the live snapshot never subscribed"
        node_id, _ = register(ctx, "eu-west", "mine", 2, 1.0)
        assert_same(ctx, live)
        steps = [
            lambda: register(other, "us-east", "theirs", 3, 2.0),
            lambda: on_node_lost(other, node_id, "seen lost by replica 2"),
            lambda: heartbeat(other, node_id, persist=True),
        ]
        for step in steps:
            step()
            with session_scope(ctx.session_factory) as s:
                expected = _plain(build_snapshot(s))
            deadline = time.monotonic() + 10.0
            while _plain(live.snapshot()) != expected and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _plain(live.snapshot()) == expected
    finally:
        stop_loop.set()
        thread.join(10.0)
        loop.close()
        if bus2 is not ctx.bus:
            bus2.close()
        engine2.dispose()


def test_a_fleet_that_arrived_settles_the_heap_and_keeps_the_options(
    ctx: ServerContext, live: LiveSnapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_snapshot, "SETTLE_MIN_CLUSTERS", 2)
    try:
        gc.unfreeze()
        register(ctx, "eu-west", "a", 2, 1.0)
        b, _ = register(ctx, "us-east", "b", 2, 1.0)
        live.snapshot()  # both clusters newly built: pools derived, heap settled
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        with session_scope(ctx.session_factory) as s:
            tenant = add_tenant(s)
            node = s.get(Node, b)
            assert node is not None
            hold_devices(s, tenant, node, [0])
        live.snapshot()  # one cluster of two rebuilt: below the threshold of 2
        assert gc.get_freeze_count() == 0
        with session_scope(ctx.session_factory) as s:
            node = s.get(Node, b)
            assert node is not None
            hold_devices(s, tenant, node, [1])
        snap = live.snapshot()  # two rebuilds since the last settle
        assert gc.get_freeze_count() > 0
        spec = tiny_spec(qos={"objective": "time"})
        with session_scope(ctx.session_factory) as s:
            fresh = build_snapshot(s)
        assert [o.model_dump() for o in plan(spec, snap)] == [o.model_dump() for o in plan(spec, fresh)]
    finally:
        gc.unfreeze()
