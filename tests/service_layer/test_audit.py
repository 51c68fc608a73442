"""The audit log: admin actions and price changes, with who, what, when and from where."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import select

from orchestration.db.models import Price
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import Registered, new_tenant, register_node

pytestmark = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _reprice(server: ServerHandle, node: Registered, price: float) -> Registered:
    """The node re-registers with its own credentials (getting new ones), declaring a price."""
    request = agent_pb2.RegisterRequest(
        node_id=node.node_id,
        node_token=node.node_token,
        region="eu-west",
        cluster="paris-1",
        provider="acme",
        devices=[agent_pb2.Device(index=0, model="cpu", memory_gb=16.0, measured_tflops=0.5, kind="cpu")],
        price_per_device_hour=price,
        advertise_host="127.0.0.1",
        sync_port_min=29000,
        sync_port_max=29049,
        jurisdiction="EU",
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        reply = agent_pb2_grpc.AgentServiceStub(channel).Register(request, timeout=10)
    return Registered(reply.node_id, reply.node_token, reply.cluster_id)


def test_admin_actions_and_price_changes_are_audited(server: ServerHandle, admin: CpnClient) -> None:
    token = admin.create_token("acme", note="rack 7", max_uses=2)["token"]
    node = register_node(server, token, region="eu-west", cluster="paris-1", price=1.20, devices=1)
    node = _reprice(server, node, 1.20)  # the same price again is not a change
    node = _reprice(server, node, 1.50)
    tenant, alice = new_tenant(admin, server, "alice")

    log = admin._call("GET", "/v1/audit")
    actions = [e["action"] for e in log]
    assert actions == [
        "token.created",
        "region.jurisdiction_claimed",  # the first agent's claim, awaiting an admin's approval
        "price.set",
        "price.changed",
        "tenant.created",
        "key.created",
    ]
    created = log[0]
    assert created["actor_kind"] == "tenant" and created["source"] == "127.0.0.1"
    assert created["details"]["note"] == "rack 7" and "token" not in created["details"]
    changed = log[3]
    assert changed["actor_kind"] == "node" and changed["actor_id"] == node.node_id and changed["source"]
    assert changed["details"]["price_per_device_hour"] == 1.50
    assert changed["details"]["previous"]["price_per_device_hour"] == 1.20
    assert log[4]["target"] == f"tenant {tenant['id']}"
    with server.ctx.session_factory() as session:
        rows = session.scalars(select(Price).order_by(Price.effective_from)).all()
        assert [(r.price_per_device_hour, r.set_by_node_id) for r in rows] == [
            (1.20, node.node_id),
            (1.50, node.node_id),
        ]

    # paging by cursor, filtering by action
    first = admin._call("GET", "/v1/audit", params={"limit": 1})
    rest = admin._call("GET", "/v1/audit", params={"after": first[0]["id"]})
    assert [e["id"] for e in first + rest] == [e["id"] for e in log]
    keys = admin._call("GET", "/v1/audit", params={"action": "key.created"})
    assert [e["action"] for e in keys] == ["key.created"]
    # tenants cannot read it
    with pytest.raises(ApiError) as err:
        alice._call("GET", "/v1/audit")
    assert err.value.status == 403
