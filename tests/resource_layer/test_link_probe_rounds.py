"""Scheduling rounds on SQLite and PostgreSQL: who is told to probe whom, with a ticket the target's
key verifies; busy nodes wait; silent probes expire and their links come round again."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from contracts.link_probe import Ticket, new_probe_key, verify
from orchestration.bus import InProcessBus
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import make_engine, make_session_factory
from orchestration.db.models import LinkProbe, Node
from orchestration.settings import Settings
from resource_layer.link_probes import record_result, schedule_once
from resource_layer.liveness import node_alive_key
from tests.orchestration.fleet import add_cluster


def fleet(ctx: ServerContext, regions: list[str]) -> dict[str, tuple[str, str]]:
    """One alive, probe-serving node per region: region -> (node id, probe key)."""
    out = {}
    with ctx.session_factory() as s, s.begin():
        for i, region in enumerate(regions):
            _, (node,) = add_cluster(s, region=region, advertise_host=f"10.0.0.{i + 1}")
            node.probe_port, node.probe_key = 30000 + i, new_probe_key()
            out[region] = (node.id, node.probe_key)
    for node_id, _ in out.values():
        ctx.bus.touch(node_alive_key(node_id), 60)
    return out


def rounds_with_orders(ctx: ServerContext, nodes: list[str], rounds: int) -> list[dict[str, Any]]:
    """Run ``rounds`` scheduling rounds while listening on the nodes' channels as their streams do."""

    async def main() -> list[dict[str, Any]]:
        got = []
        async with ctx.bus.subscribe(*(f"node.{n}" for n in nodes)) as sub:
            for _ in range(rounds):
                await asyncio.to_thread(schedule_once, ctx)
            while True:
                try:
                    channel, message = await asyncio.wait_for(anext(sub), 0.5)
                except TimeoutError:
                    return got
                got.append({"to": channel.removeprefix("node."), **message["probe"]})

    return asyncio.run(main())


def test_rounds_order_signed_probes_one_per_node(db_url: str) -> None:
    ctx = ServerContext(
        Settings(database_url=db_url), make_session_factory(make_engine(db_url)), InProcessBus()
    )
    try:
        nodes = fleet(ctx, ["ap-south", "eu-west", "us-east"])
        by_id = {node_id: (region, key) for region, (node_id, key) in nodes.items()}
        ids = [n for n, _ in nodes.values()]
        orders = rounds_with_orders(ctx, ids, rounds=2)
        assert len(orders) == 1  # three nodes: one probe at a time, the third node has no partner
        (o,) = orders
        t = o["ticket"]
        target_region, target_key = by_id[t["target_node_id"]]
        ticket = Ticket(
            t["probe_id"], t["target_node_id"], t["bulk_bytes"], t["echoes"], t["expires_at"], t["mac"]
        )
        verify(target_key, t["target_node_id"], ticket, time.time())  # the target will accept it
        assert o["target_host"] == f"10.0.0.{['ap-south', 'eu-west', 'us-east'].index(target_region) + 1}"
        assert (
            t["bulk_bytes"] == ctx.settings.link_probe_bytes and t["echoes"] == ctx.settings.link_probe_echoes
        )
        with ctx.session_factory() as s:
            row = s.get(LinkProbe, t["probe_id"])
            assert row is not None and row.status == "pending" and row.src_node_id == o["to"]

        # Its result frees both nodes: the next round orders another link.
        with ctx.session_factory() as s, s.begin():
            record_result(s, o["to"], {"probe_id": t["probe_id"], "rtt_ms": 1.0, "bulk_bytes": 1 << 20,
                                       "bulk_s": 0.01, "duration_s": 0.05})  # fmt: skip
        (nxt,) = rounds_with_orders(ctx, ids, rounds=1)
        first_pair = (by_id[o["to"]][0], target_region)
        assert (by_id[nxt["to"]][0], by_id[nxt["ticket"]["target_node_id"]][0]) != first_pair

        # A probe that never reports expires after the timeout, and its link comes round again.
        with ctx.session_factory() as s, s.begin():
            s.execute(
                update(LinkProbe)
                .where(LinkProbe.id == nxt["ticket"]["probe_id"])
                .values(requested_at=utcnow() - timedelta(seconds=ctx.settings.link_probe_timeout_s + 1))
            )
        assert len(rounds_with_orders(ctx, ids, rounds=1)) == 1
        with ctx.session_factory() as s:
            expired = s.get(LinkProbe, nxt["ticket"]["probe_id"])
            assert expired is not None and expired.status == "failed" and "no result" in expired.error

        # Nodes whose liveness has lapsed are not probed; once they heartbeat again, they are.
        with ctx.session_factory() as s, s.begin():
            s.execute(update(LinkProbe).where(LinkProbe.status == "pending").values(status="failed"))
        for node_id in ids:
            ctx.bus.touch(node_alive_key(node_id), 0.01)
        time.sleep(0.05)
        assert rounds_with_orders(ctx, ids, rounds=1) == []
        for node_id in ids:
            ctx.bus.touch(node_alive_key(node_id), 60)
        assert len(rounds_with_orders(ctx, ids, rounds=1)) == 1
    finally:
        ctx.bus.close()


def test_a_node_measuring_its_profile_is_probed_only_once_the_profile_lands(db_url: str) -> None:
    ctx = ServerContext(
        Settings(database_url=db_url), make_session_factory(make_engine(db_url)), InProcessBus()
    )
    try:
        nodes = fleet(ctx, ["eu-west", "us-east"])
        ids = [n for n, _ in nodes.values()]
        with ctx.session_factory() as s, s.begin():
            s.execute(update(Node).where(Node.id == ids[0]).values(measuring=True))
        assert rounds_with_orders(ctx, ids, rounds=1) == []  # its partner has no one to probe
        with ctx.session_factory() as s, s.begin():
            s.execute(update(Node).where(Node.id == ids[0]).values(measuring=False))
        (order,) = rounds_with_orders(ctx, ids, rounds=1)
        assert {order["to"], order["ticket"]["target_node_id"]} == set(ids)
    finally:
        ctx.bus.close()
