"""The Connect stream, driven by a plain gRPC client against a real server and database."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from orchestration.context import ServerContext
from orchestration.db.models import Node, Task
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer.liveness import node_alive_key
from tests.resource_layer.harness import GrpcServerThread, add_task, enrollment_token, wait_for

Stub = agent_pb2_grpc.AgentServiceStub
# Backend-independent behaviour: SQLite only (the shared fixtures also run PostgreSQL + Redis).
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


class Stream:
    """One Connect call: ``send`` messages up, ``recv`` what comes down (with a timeout)."""

    def __init__(self, stub: Stub) -> None:
        self._up: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self._down: queue.Queue[Any] = queue.Queue()
        self.call = stub.Connect(iter(self._up.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self._down.put(message)
            self._down.put(StopIteration())
        except grpc.RpcError as exc:
            self._down.put(exc)

    def send(self, **kind: Any) -> None:
        self._up.put(agent_pb2.AgentMessage(**kind))

    def recv(self, timeout: float = 10.0) -> agent_pb2.ServerMessage:
        item = self._down.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._up.put(None)
        self.call.cancel()


@pytest.fixture
def ctx(ctx: ServerContext) -> ServerContext:
    """The shared context with a liveness TTL (2 s) that a loaded test machine cannot outrun."""
    relaxed = ctx.settings.model_copy(update={"heartbeat_interval_s": 0.25, "heartbeat_misses": 8})
    return dataclasses.replace(ctx, settings=relaxed)


@pytest.fixture
def server(ctx: ServerContext) -> Iterator[GrpcServerThread]:
    srv = GrpcServerThread(ctx, heartbeat_db_every_s=0.0).start()
    yield srv
    srv.stop()


@pytest.fixture
def stub(server: GrpcServerThread) -> Iterator[Stub]:
    with grpc.insecure_channel(server.target) as channel:
        yield agent_pb2_grpc.AgentServiceStub(channel)


@pytest.fixture
def node(ctx: ServerContext, stub: Stub) -> agent_pb2.RegisterResponse:
    device = agent_pb2.Device(index=0, model="cpu", memory_gb=1.0, measured_tflops=0.01, kind="cpu")
    return stub.Register(
        agent_pb2.RegisterRequest(
            enrollment_token=enrollment_token(ctx),
            region="eu-west",
            cluster="paris-1",
            devices=[device],
            price_per_device_hour=1.0,
            advertise_host="127.0.0.1",
            sync_port_min=29600,
            sync_port_max=29610,
        ),
        timeout=10,
    )


def hello(node: agent_pb2.RegisterResponse, running: list[str] | None = None) -> agent_pb2.Hello:
    return agent_pb2.Hello(
        node_id=node.node_id, node_token=node.node_token, running_assignments=running or []
    )


@SQLITE_ONLY
def test_first_message_must_be_hello(stub: Stub, node: agent_pb2.RegisterResponse) -> None:
    s = Stream(stub)
    s.send(heartbeat=agent_pb2.Heartbeat(seq=1))
    with pytest.raises(grpc.RpcError) as err:
        s.recv()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "first message must be a Hello" in err.value.details()


@pytest.mark.parametrize("which", ["token", "node_id"])
@SQLITE_ONLY
def test_hello_with_bad_credentials_is_unauthenticated(
    stub: Stub, node: agent_pb2.RegisterResponse, which: str
) -> None:
    s = Stream(stub)
    bad = hello(node)
    setattr(bad, "node_token" if which == "token" else "node_id", "wrong")
    s.send(hello=bad)
    with pytest.raises(grpc.RpcError) as err:
        s.recv()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_heartbeats_keep_the_node_alive_and_silence_lets_it_expire(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    key = node_alive_key(node.node_id)
    s = Stream(stub)
    s.send(hello=hello(node))
    ack = s.recv().ack
    assert ack.node_id == node.node_id and ack.heartbeat_interval_s == ctx.settings.heartbeat_interval_s
    assert ctx.bus.alive(key)
    with ctx.session_factory() as session:
        first_seen = session.get(Node, node.node_id).last_heartbeat_at  # type: ignore[union-attr]
    assert first_seen is not None

    ttl = ctx.settings.node_lost_after_s
    end = time.monotonic() + 1.5 * ttl  # past one TTL: only the heartbeats keep the key alive
    seq = 0
    while time.monotonic() < end:
        seq += 1
        s.send(heartbeat=agent_pb2.Heartbeat(seq=seq, sent_at=time.time()))
        time.sleep(ctx.settings.heartbeat_interval_s)
        assert ctx.bus.alive(key), f"node expired despite heartbeat {seq}"
    with ctx.session_factory() as session:
        last = session.get(Node, node.node_id).last_heartbeat_at  # type: ignore[union-attr]
    assert last is not None and last > first_seen
    wait_for(lambda: ctx.metrics.heartbeats._value.get() >= seq, timeout=5, what="heartbeats to be counted")

    s.close()
    wait_for(lambda: not ctx.bus.alive(key), timeout=3 * ttl, what="the liveness key to expire")


def test_bus_messages_for_the_node_reach_its_stream(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    s = Stream(stub)
    s.send(hello=hello(node))
    assert s.recv().WhichOneof("kind") == "ack"
    other = Stream(stub)  # a different node's channel must not leak into this stream
    channel = f"node.{node.node_id}"
    # The subscription is live once the Ack has been sent; publish until the first message lands.
    ctx.bus.publish("node.someone-else", {"drain": {"reason": "not for you"}})
    ctx.bus.publish(
        channel,
        {
            "assignment": {
                "assignment_id": "a1",
                "job_id": "j1",
                "attempt": 2,
                "device_indices": [0],
                "nproc": 1,
                "worker_config": {"job_id": "j1", "training": {"steps": 3}},
            }
        },
    )
    ctx.bus.publish(channel, {"cancel": {"assignment_id": "a1", "reason": "user asked"}})
    ctx.bus.publish(channel, {"drain": {"reason": "maintenance"}})
    a = s.recv().assignment
    assert (a.assignment_id, a.job_id, a.attempt, list(a.device_indices), a.nproc) == ("a1", "j1", 2, [0], 1)
    assert '"steps": 3' in a.worker_config_json
    assert s.recv().cancel.reason == "user asked"
    assert s.recv().drain.reason == "maintenance"
    s.close()
    other.close()


def test_reconnect_resends_pending_assignments_the_node_does_not_run(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    config = {"job_id": "x", "training": {"steps": 1}}
    _, running = add_task(ctx.session_factory, node.node_id, node.cluster_id, "eu-west", config)
    _, lost = add_task(ctx.session_factory, node.node_id, node.cluster_id, "eu-west", config)
    s = Stream(stub)
    s.send(hello=hello(node, running=[running]))
    assert s.recv().WhichOneof("kind") == "ack"
    resent = s.recv().assignment
    assert resent.assignment_id == lost
    s.close()


@SQLITE_ONLY
def test_a_newer_stream_supersedes_the_older(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    old = Stream(stub)
    old.send(hello=hello(node))
    assert old.recv().WhichOneof("kind") == "ack"
    new = Stream(stub)
    new.send(hello=hello(node))
    assert new.recv().WhichOneof("kind") == "ack"
    with pytest.raises(StopIteration):
        old.recv()  # ended cleanly by the server
    ctx.bus.publish(f"node.{node.node_id}", {"drain": {"reason": "only once"}})
    assert new.recv().drain.reason == "only once"
    new.close()


@SQLITE_ONLY
def test_status_for_a_task_of_another_node_does_not_cut_the_stream(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    s = Stream(stub)
    s.send(hello=hello(node))
    assert s.recv().WhichOneof("kind") == "ack"
    s.send(task_status=agent_pb2.TaskStatus(assignment_id="no-such-task", state=agent_pb2.TASK_STATE_RUNNING))
    s.send(heartbeat=agent_pb2.Heartbeat(seq=1))
    ctx.bus.publish(f"node.{node.node_id}", {"drain": {"reason": "still here"}})
    assert s.recv().drain.reason == "still here"
    with ctx.session_factory() as session:
        assert session.scalars(select(Task)).all() == []
    s.close()


@SQLITE_ONLY
def test_a_drained_node_is_told_again_when_it_reconnects(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    with ctx.session_factory() as session, session.begin():
        row = session.get(Node, node.node_id)
        assert row is not None
        row.status = "drained"
    s = Stream(stub)
    s.send(hello=hello(node))
    assert s.recv().WhichOneof("kind") == "ack"
    assert s.recv().drain.reason == "node is drained"
    with ctx.session_factory() as session:
        assert session.get(Node, node.node_id).status == "drained"  # type: ignore[union-attr]
    s.close()


@SQLITE_ONLY
def test_a_lost_node_that_connects_again_is_alive(
    ctx: ServerContext, stub: Stub, node: agent_pb2.RegisterResponse
) -> None:
    with ctx.session_factory() as session, session.begin():
        session.get(Node, node.node_id).status = "lost"  # type: ignore[union-attr]
    s = Stream(stub)
    s.send(hello=hello(node))
    assert s.recv().WhichOneof("kind") == "ack"
    with ctx.session_factory() as session:
        assert session.get(Node, node.node_id).status == "alive"  # type: ignore[union-attr]
    s.close()


@SQLITE_ONLY
def test_a_profile_sent_on_the_stream_makes_a_measuring_node_placeable(
    ctx: ServerContext, stub: Stub
) -> None:
    """Registered with its profile to follow: heartbeats keep it alive while it measures; the
    ProfileReport that lands (sent again on a later stream, which changes nothing) ends measuring."""
    from control_layer.snapshot import build_snapshot

    device = agent_pb2.Device(index=0, model="cpu", memory_gb=1.0, measured_tflops=0.01, kind="cpu")
    node = stub.Register(
        agent_pb2.RegisterRequest(
            enrollment_token=enrollment_token(ctx), region="eu-west", cluster="paris-1", devices=[device],
            price_per_device_hour=1.0, advertise_host="127.0.0.1", sync_port_min=29600, sync_port_max=29610,
            profile_follows=True,
        ),
        timeout=10,
    )  # fmt: skip

    def row() -> Node:
        with ctx.session_factory() as session:
            got = session.get(Node, node.node_id)
            assert got is not None
            session.expunge(got)
            return got

    def placed() -> bool:
        with ctx.session_factory() as session:
            return any(n.id == node.node_id for c in build_snapshot(session).clusters for n in c.nodes)

    s = Stream(stub)
    s.send(hello=hello(node))
    assert s.recv().WhichOneof("kind") == "ack"
    s.send(heartbeat=agent_pb2.Heartbeat(seq=1))
    wait_for(lambda: row().last_heartbeat_at is not None, what="the heartbeat stored")
    assert ctx.bus.alive(node_alive_key(node.node_id)) and row().measuring and not placed()

    rate = agent_pb2.MeasuredStepRate(precision="fp32", tflops=0.04, micro_batch_s=0.004, step_s=0.001)
    profile = agent_pb2.MeasuredProfile(startup_s=5.0, teardown_s=0.5, physical_cores=2, rates=[rate])
    report = agent_pb2.ProfileReport(measured_profile=profile)
    bad = agent_pb2.ProfileReport()
    bad.CopyFrom(report)
    bad.measured_profile.teardown_s = -1.0
    s.send(profile=bad)  # refused: the node stays measuring, and the stream goes on
    s.send(profile=report)
    wait_for(lambda: not row().measuring, what="the profile recorded")
    assert row().profile["startup_s"] == 5.0 and placed()  # type: ignore[index]
    s.send(profile=report)
    s.send(heartbeat=agent_pb2.Heartbeat(seq=2))
    s.send(profile=bad)
    wait_for(lambda: row().last_heartbeat_at is not None, what="the stream still read")
    assert not row().measuring and row().profile["startup_s"] == 5.0  # type: ignore[index]
    s.close()
