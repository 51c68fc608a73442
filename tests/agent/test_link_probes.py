"""Agents measure the links between regions: real agent processes probe each other on loopback on
the resource layer's orders; results land in the database and feed the planner's snapshot."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from sqlalchemy import select

from agent.probe import run_probe
from contracts.errors import NotFound
from contracts.link_probe import CHUNK_BYTES, Ticket, new_probe_key, sign
from control_layer.live_snapshot import attach_live_snapshot
from control_layer.snapshot import build_snapshot
from orchestration.db.models import LinkProbe, Node
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer.link_probes import record_result, schedule_once
from resource_layer.liveness import node_alive_key
from service_layer.links import upsert_link
from service_layer.queries import list_links
from tests.agent.conftest import Plane, StartAgent, node_of
from tests.resource_layer.harness import wait_for


def connected(plane: Plane, cluster: str) -> Node:
    node = node_of(plane, cluster)
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what=f"{cluster}'s stream")
    with plane.ctx.session_factory() as s:
        fresh = s.get(Node, node.id)
        assert fresh is not None
        return fresh


def finished(plane: Plane, probe_id: str) -> LinkProbe:
    def done() -> LinkProbe | None:
        with plane.ctx.session_factory() as s:
            row = s.get(LinkProbe, probe_id)
            return row if row is not None and row.status != "pending" else None

    return wait_for(done, timeout=60, what=f"probe {probe_id}'s result")


@pytest.mark.slow
def test_agents_probe_each_other_and_the_snapshot_uses_what_they_measured(
    plane: Plane, start_agent: StartAgent
) -> None:
    start_agent("a", region="eu-west", cluster="paris-1")
    start_agent("b", region="us-east", cluster="virginia-1")
    live = attach_live_snapshot(plane.ctx)  # the server's in-memory snapshot must hear results too
    a, b = connected(plane, "paris-1"), connected(plane, "virginia-1")
    assert a.probe_port > 0 and b.probe_port > 0 and a.probe_key and a.probe_key != b.probe_key
    with plane.ctx.session_factory() as s, s.begin():
        upsert_link(s, "eu-west", "us-east", 0.5, 80.0, 0.02)
    with plane.ctx.session_factory() as s:
        assert [ln.source for ln in build_snapshot(s).links] == ["declared"]

    # At registration both directions are due; each node takes part in one probe at a time, so the
    # second is ordered only once the first has reported.
    ordered: list[str] = []
    deadline = time.monotonic() + 90
    while len(ordered) < 2:
        assert time.monotonic() < deadline, f"only {ordered} ordered"
        ordered += schedule_once(plane.ctx)
        with plane.ctx.session_factory() as s:
            pending = s.scalars(select(LinkProbe).where(LinkProbe.status == "pending")).all()
        assert len(pending) <= 1
        time.sleep(0.05)
    rows = [finished(plane, pid) for pid in ordered]
    row1 = rows[0]
    assert {(r.src_region, r.dst_region) for r in rows} == {("eu-west", "us-east"), ("us-east", "eu-west")}
    for r in rows:
        assert r.status == "ok", r.error
        assert r.rtt_ms is not None and 0 < r.rtt_ms < 1000
        assert r.bandwidth_gbps is not None and r.bandwidth_gbps > 0.01  # loopback: far above 10 Mbit/s
        assert r.duration_s is not None and r.duration_s > 0
    # Within the interval (and the 1 % budget) nothing is due again.
    assert schedule_once(plane.ctx) == []

    with plane.ctx.session_factory() as s:
        links = {(ln.src, ln.dst): ln for ln in build_snapshot(s).links}
        shown = {(ln.src, ln.dst): ln for ln in list_links(s, fresh_s=600)}
        # A result from a node the probe was not ordered from changes nothing.
        with pytest.raises(NotFound):
            record_result(s, b.id if row1.src_node_id == a.id else a.id, {"probe_id": row1.id})
    assert {k: v.source for k, v in links.items()} == {
        ("eu-west", "us-east"): "measured",
        ("us-east", "eu-west"): "measured",
    }
    assert {(ln.src, ln.dst): ln.source for ln in live.snapshot().links} == {
        ("eu-west", "us-east"): "measured",
        ("us-east", "eu-west"): "measured",
    }
    fwd = links[("eu-west", "us-east")]
    assert fwd.bandwidth_gbps == pytest.approx(
        next(r for r in rows if r.src_region == "eu-west").bandwidth_gbps
    )
    assert fwd.egress_price_per_gb == 0.02  # the price still comes from the declared link
    assert (
        shown[("eu-west", "us-east")].source == "measured" and "probe" in shown[("eu-west", "us-east")].basis
    )
    # Once the measurements are older than the freshness window, the declared link is back.
    with plane.ctx.session_factory() as s:
        assert [(ln.source, ln.bandwidth_gbps) for ln in build_snapshot(s, link_fresh_s=1e-3).links] == [
            ("declared", 0.5)
        ]


@pytest.mark.slow
def test_the_probe_service_refuses_strangers_replays_and_oversized_transfers(
    plane: Plane, start_agent: StartAgent
) -> None:
    start_agent("a")
    node = connected(plane, "paris-1")
    target = f"127.0.0.1:{node.probe_port}"

    def ticket(
        key: str, probe_id: str, bulk: int = 2 * CHUNK_BYTES, echoes: int = 2
    ) -> agent_pb2.LinkProbeTicket:
        t = sign(key, Ticket(probe_id, node.id, bulk, echoes, float(int(time.time()) + 60)))
        return agent_pb2.LinkProbeTicket(
            probe_id=t.probe_id,
            target_node_id=t.target_node_id,
            bulk_bytes=t.bulk_bytes,
            echoes=t.echoes,
            expires_at=t.expires_at,
            mac=t.mac,
        )

    def code(call: object) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as err:
            call()  # type: ignore[operator]
        return err.value.code()  # type: ignore[attr-defined]

    def chunks(t: agent_pb2.LinkProbeTicket, n: int, size: int = CHUNK_BYTES):  # type: ignore[no-untyped-def]
        for i in range(n):
            yield agent_pb2.LinkProbeChunk(ticket=t if i == 0 else None, data=b"x" * size)

    with grpc.insecure_channel(target) as channel:
        stub = agent_pb2_grpc.LinkProbeServiceStub(channel)
        forged = ticket(new_probe_key(), "p0")
        assert code(lambda: stub.Echo(agent_pb2.LinkProbeEcho(ticket=forged), timeout=10)) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code(lambda: stub.Bulk(chunks(forged, 2), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED

        good = ticket(node.probe_key, "p1")
        for seq in range(2):
            assert stub.Echo(agent_pb2.LinkProbeEcho(ticket=good, seq=seq), timeout=10).seq == seq
        assert code(lambda: stub.Echo(agent_pb2.LinkProbeEcho(ticket=good), timeout=10)) == (
            grpc.StatusCode.UNAUTHENTICATED  # the ticket's echoes are used up
        )
        reply = stub.Bulk(chunks(good, 2), timeout=10)
        assert reply.bytes == 2 * CHUNK_BYTES and reply.timed_bytes == CHUNK_BYTES
        assert (
            code(lambda: stub.Bulk(chunks(good, 2), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        )  # replay

        more = ticket(node.probe_key, "p2")
        assert code(lambda: stub.Bulk(chunks(more, 3), timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
        big = ticket(node.probe_key, "p3")
        assert code(lambda: stub.Bulk(chunks(big, 1, size=CHUNK_BYTES * 2), timeout=10)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED  # a chunk over the message limit never reaches us
        )
    with plane.ctx.session_factory() as s:
        assert s.scalars(select(LinkProbe)).all() == []  # nothing the control plane ordered


def test_a_probe_that_cannot_run_reports_why_instead_of_raising() -> None:
    def order(expires_at: float, port: int = 1) -> agent_pb2.LinkProbeOrder:
        t = agent_pb2.LinkProbeTicket(probe_id="p", target_node_id="n", bulk_bytes=1 << 20, echoes=2,
                                      expires_at=expires_at, mac="00")  # fmt: skip
        return agent_pb2.LinkProbeOrder(ticket=t, target_host="127.0.0.1", target_port=port)

    late = asyncio.run(run_probe(order(time.time() - 1)))
    assert late.probe_id == "p" and "expired" in late.error and late.bulk_bytes == 0
    nobody = asyncio.run(run_probe(order(time.time() + 30)))  # nothing listens on port 1
    assert "UNAVAILABLE" in nobody.error and nobody.rtt_ms == 0 and nobody.duration_s > 0
