"""Cordon, drain and revocation of nodes on a live control plane: REST in, gRPC to the node."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from sqlalchemy import select, update

from contracts.errors import PermissionDenied
from control_layer.live_snapshot import LiveSnapshot
from control_layer.node_control import NOT_WIRED
from orchestration.db.models import Job, Task
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer import registry
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.resource_layer.harness import add_task, wait_for
from tests.resource_layer.test_stream import Stream
from tests.service_layer.harness import Registered, register_node, small_spec


def operator_of(admin: CpnClient, server: ServerHandle) -> CpnClient:
    platform = next(t for t in admin._call("GET", "/v1/tenants") if t["is_admin"])
    key = admin.add_key(role="operator", name="ops", tenant_id=platform["id"])["key"]
    return CpnClient(server.http_url, key)


def one_node(server: ServerHandle, admin: CpnClient) -> Registered:
    token = admin.create_token("acme", max_uses=1)["token"]
    return register_node(server, token, region="eu-west", cluster="paris-1", price=1.0)


def placeable(server: ServerHandle) -> set[str]:
    live = server.ctx.live_snapshot
    assert isinstance(live, LiveSnapshot)  # the planner's in-memory view, kept by the change feed
    return {n.id for c in live.snapshot().clusters for n in c.nodes}


def node_row(admin: CpnClient, node_id: str) -> dict[str, Any]:
    return next(n for c in admin.clusters() for n in c["nodes"] if n["id"] == node_id)


def job_on(server: ServerHandle, node: Registered) -> tuple[str, str]:
    """A placed job with one dispatched task on the node; its spec one the placer can plan again."""
    job_id, task_id = add_task(server.ctx.session_factory, node.node_id, node.cluster_id, "eu-west", {})
    with server.ctx.session_factory() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(spec=small_spec()))
    return job_id, task_id


def connect(server: ServerHandle, node: Registered) -> tuple[grpc.Channel, Stream]:
    channel = grpc.insecure_channel(server.grpc_target)
    stream = Stream(agent_pb2_grpc.AgentServiceStub(channel))
    stream.send(hello=agent_pb2.Hello(node_id=node.node_id, node_token=node.node_token))
    assert stream.recv().WhichOneof("kind") == "ack"
    return channel, stream


def test_a_cordon_removes_the_node_from_placement_at_once(server: ServerHandle, admin: CpnClient) -> None:
    node = one_node(server, admin)
    assert placeable(server) == {node.node_id}
    with operator_of(admin, server) as operator:
        out = operator.node_action(node.node_id, "cordon", reason="disk swap")
        assert (out["status"], out["cordon"], out["running_jobs"]) == ("alive", "cordoned", [])
        assert placeable(server) == set()  # no wait: this replica applied its own commit
        assert operator.snapshot()["clusters"] == []
        assert node_row(admin, node.node_id)["cordon"] == "cordoned"
        with pytest.raises(ApiError) as refused:
            admin.quote(small_spec())
        assert refused.value.status == 409  # nothing left to plan on

        for bad in ((node.node_id, {"reason": "x" * 256}), (node.node_id, {"why": "?"}), ("n" * 65, {})):
            with pytest.raises(ApiError) as invalid:
                operator._call("POST", f"/v1/nodes/{bad[0]}/uncordon", json=bad[1])
            assert invalid.value.status == 422
        assert node_row(admin, node.node_id)["cordon"] == "cordoned"  # bad input changed nothing
        assert operator.node_action(node.node_id, "uncordon")["cordon"] == ""
        assert placeable(server) == {node.node_id}
        assert admin.quote(small_spec())["options"]
    audit = [(e["action"], e["details"].get("role")) for e in admin._call("GET", "/v1/audit")]
    assert ("node.cordoned", "operator") in audit and ("node.uncordoned", "operator") in audit


def test_a_drain_tells_the_agent_and_moves_its_jobs(server: ServerHandle, admin: CpnClient) -> None:
    node = one_node(server, admin)
    channel, stream = connect(server, node)
    job_id, task_id = job_on(server, node)
    assert server.ctx.preempt_job is not None  # the server's own hook: control_layer.preemption
    try:
        with operator_of(admin, server) as operator:
            # a job whose spec forbids preemption stays where it runs, and the answer says so
            out = operator.node_action(node.node_id, "drain", reason="maintenance")
            assert (out["cordon"], out["moved_jobs"], out["running_jobs"]) == ("draining", [], [job_id])
            assert out["note"] and out["note"] != NOT_WIRED
            assert stream.recv().drain.reason == "maintenance"
            assert placeable(server) == set()
            stream.close()
            channel.close()
            channel, stream = connect(server, node)  # a restarted agent is told again
            assert stream.recv().drain.reason == "node is drained"

            # once preemptible, the next drain moves it: its task is told to checkpoint and stop
            with server.ctx.session_factory() as s, s.begin():
                s.execute(update(Job).where(Job.id == job_id).values(spec=small_spec(preemptible=True)))
            out = operator.node_action(node.node_id, "drain")
            assert (out["moved_jobs"], out["running_jobs"], out["note"]) == ([job_id], [], "")
            kinds = []
            while (message := stream.recv()).WhichOneof("kind") != "preempt":
                kinds.append(message.WhichOneof("kind"))
                assert len(kinds) < 5, kinds
            assert message.preempt.assignment_id == task_id
            assert message.preempt.reason == f"node {node.node_id} drained"
            with server.ctx.session_factory() as s:
                assert s.get(Job, job_id).preemption["reason"] == f"node {node.node_id} drained"

            uncordoned = operator.node_action(node.node_id, "uncordon")
            assert uncordoned["cordon"] == "" and "restarts" in uncordoned["note"]
    finally:
        stream.close()
        channel.close()


def test_a_revoked_node_is_shut_out(server: ServerHandle, admin: CpnClient) -> None:
    node = one_node(server, admin)
    channel, stream = connect(server, node)
    job_id, task_id = job_on(server, node)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    try:
        with operator_of(admin, server) as operator:
            out = operator.node_action(node.node_id, "revoke", reason="stolen credentials")
            assert (out["status"], out["moved_jobs"]) == ("revoked", [job_id])
            assert out["note"] == ""  # its one-use token is spent: nothing to re-enroll with
            # the open stream ends ...
            with pytest.raises(grpc.RpcError) as ended:
                while True:
                    stream.recv()
            assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "revoked" in (ended.value.details() or "")
            # ... and the credentials open nothing again
            again = Stream(stub)
            again.send(hello=agent_pb2.Hello(node_id=node.node_id, node_token=node.node_token))
            with pytest.raises(grpc.RpcError) as refused:
                again.recv()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            register = agent_pb2.RegisterRequest(
                node_id=node.node_id,
                node_token=node.node_token,
                region="eu-west",
                cluster="paris-1",
                devices=[
                    agent_pb2.Device(index=0, model="cpu", memory_gb=16.0, measured_tflops=0.5, kind="cpu")
                ],
                price_per_device_hour=1.0,
                advertise_host="127.0.0.1",
                sync_port_min=29000,
                sync_port_max=29049,
            )
            with pytest.raises(grpc.RpcError) as refused:
                stub.Register(register, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

            def task_failed() -> bool:
                with server.ctx.session_factory() as s:
                    return s.scalar(select(Task.status).where(Task.id == task_id)) == "failed"

            wait_for(task_failed, what="the revoked node's task to fail")
            assert placeable(server) == set()
            assert node_row(admin, node.node_id)["status"] == "revoked"
            with pytest.raises(ApiError) as conflict:
                operator.node_action(node.node_id, "cordon")
            assert conflict.value.status == 409
            assert operator.node_action(node.node_id, "revoke")["status"] == "revoked"  # a no-op
    finally:
        stream.close()
        channel.close()
    assert "node.revoked" in [e["action"] for e in admin._call("GET", "/v1/audit")]


def test_a_stream_accepted_after_its_node_was_revoked_is_refused(
    server: ServerHandle, admin: CpnClient
) -> None:
    """A revocation landing between a stream's credential check and its subscription to the node's
    channel is published before anyone listens: accepting the stream reads it instead (the stream
    ends PERMISSION_DENIED)."""
    node = one_node(server, admin)
    with operator_of(admin, server) as operator:
        operator.node_action(node.node_id, "revoke", reason="stolen credentials")
    with pytest.raises(PermissionDenied, match="revoked"):
        registry.mark_connected(server.ctx, node.node_id)
