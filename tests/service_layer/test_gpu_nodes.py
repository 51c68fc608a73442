"""A GPU node end to end on a real control plane: it registers its devices with UUIDs and NVLink
islands, its heartbeats' device samples reach the database, /metrics and the dashboard's node
page, and a GPU fault its agent reports cordons the node with the reason the operator reads."""

from __future__ import annotations

import math

import grpc
import httpx
import pytest

from orchestration.db.models import Node
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from service_layer.client import CpnClient
from service_layer.server import ServerHandle
from tests.resource_layer.harness import wait_for
from tests.resource_layer.test_stream import Stream
from tests.service_layer.harness import ADMIN_KEY
from tests.service_layer.test_metrics import _families

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

UUIDS = [f"GPU-5f1c3a5e-0b1d-4c2e-9a7f-00000000000{i}" for i in range(2)]
FAULT = f"GPU 1 ({UUIDS[1]}): 2 uncorrectable ECC error(s) since the driver loaded"


def register_gpu_node(server: ServerHandle, admin: CpnClient) -> agent_pb2.RegisterResponse:
    token = admin.create_token(provider="acme")["token"]
    devices = [
        agent_pb2.Device(index=i, model="NVIDIA H100 80GB HBM3", memory_gb=79.65, measured_tflops=650.0,
                         kind="cuda", uuid=UUIDS[i], nvlink_island=1)
        for i in range(2)
    ]  # fmt: skip
    request = agent_pb2.RegisterRequest(
        enrollment_token=token, region="eu-west", cluster="gpu-1", provider="acme", hostname="hgx-0",
        devices=devices, price_per_device_hour=3.0, advertise_host="127.0.0.1", sync_port_min=29000,
        sync_port_max=29049, jurisdiction="EU", agent_version="test",
    )  # fmt: skip
    with grpc.insecure_channel(server.grpc_target) as channel:
        return agent_pb2_grpc.AgentServiceStub(channel).Register(request, timeout=10)


def test_heartbeat_samples_reach_metrics_and_the_node_page_and_a_fault_cordons(
    server: ServerHandle, admin: CpnClient
) -> None:
    node = register_gpu_node(server, admin)
    (listed,) = [n for c in admin.clusters() for n in c["nodes"] if n["id"] == node.node_id]
    assert [(d["uuid"], d["link_group"]) for d in listed["devices"]] == [(UUIDS[0], 0), (UUIDS[1], 0)]
    samples = [
        agent_pb2.DeviceSample(index=0, utilization=0.93, memory_used_gb=61.5, power_w=688.0,
                               temperature_c=71.0),
        agent_pb2.DeviceSample(index=1, utilization=0.0, memory_used_gb=0.5, power_w=72.0, temperature_c=33.0,
                               health=FAULT),
        agent_pb2.DeviceSample(index=2, utilization=0.5, memory_used_gb=1.0, power_w=80.0,
                               temperature_c=math.nan),  # out of bounds: left out
    ]  # fmt: skip
    with grpc.insecure_channel(server.grpc_target) as channel:
        stream = Stream(agent_pb2_grpc.AgentServiceStub(channel))
        stream.send(hello=agent_pb2.Hello(node_id=node.node_id, node_token=node.node_token))
        assert stream.recv().ack.node_id == node.node_id
        stream.send(heartbeat=agent_pb2.Heartbeat(seq=1, devices=samples))

        def stored() -> Node | None:
            with server.ctx.session_factory() as s:
                row = s.get_one(Node, node.node_id)
                return row if row.device_samples is not None else None

        row = wait_for(stored, timeout=20, what="the heartbeat's device samples to be stored")
        stream.close()
    assert [d["index"] for d in row.device_samples["devices"]] == [0, 1]
    assert row.cordon == "cordoned" and row.cordon_reason == f"device 1: {FAULT}"
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.http_url, timeout=10, headers=auth) as client:
        fams = _families(client.get("/metrics").text)
        page = client.get(f"/dashboard/nodes/{node.node_id}")
        missing = client.get("/dashboard/nodes/nope")
    power = {
        labels["device"]: v for labels, v in fams["cpn_device_power_watts"] if labels["node"] == node.node_id
    }
    healthy = {
        labels["device"]: v for labels, v in fams["cpn_device_healthy"] if labels["node"] == node.node_id
    }
    assert power == {"0": 688.0, "1": 72.0} and healthy == {"0": 1.0, "1": 0.0}
    assert [v for labels, v in fams["cpn_device_memory_used_bytes"] if labels["device"] == "0"] == [
        61.5 * 2**30
    ]
    assert page.status_code == 200
    for text in (UUIDS[0], "93 %", "688 W", "71 °C", f"Cordoned by its GPU health rules: device 1: {FAULT}"):
        assert text in page.text, text
    assert missing.status_code == 404 and "No such node" in missing.text
    # The operator reads the reason, fixes the GPU and uncordons: the reason goes with the cordon.
    admin.node_action(node.node_id, "uncordon")
    (listed,) = [n for c in admin.clusters() for n in c["nodes"] if n["id"] == node.node_id]
    assert listed["cordon"] == "" and listed["cordon_reason"] == ""
