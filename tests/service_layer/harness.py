"""A live control plane for service-layer tests: real REST + gRPC on loopback, real registrations."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy import func, select

from orchestration.db.models import Cluster, Job, LinkProbe, Node, Quote
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer.link_probes import record_result
from resource_layer.registry import heartbeat
from service_layer.client import CpnClient
from service_layer.server import ServerHandle

ADMIN_KEY = "cpn_admin_" + secrets.token_urlsafe(24)


def small_spec(name: str = "tiny-gpt", steps: int = 40, **qos: Any) -> dict[str, Any]:
    """A job small enough for CPU slots: 2 layers, vocab 64."""
    return {
        "name": name,
        "model": {"family": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 64, "seq_len": 64},
        "data": {"kind": "synthetic-markov", "seed": 0},
        "training": {"steps": steps, "global_batch_tokens": 4 * 8 * 64, "lr": 3e-3},
        "parallelism": "auto",
        "sync": {"mode": "diloco", "every": 10, "compression": "int8"},
        "qos": {"max_hours": 1, "max_cost": 10, **qos},
    }


@dataclass
class Registered:
    node_id: str
    node_token: str
    cluster_id: str


def register_node(
    server: ServerHandle,
    token: str,
    *,
    region: str,
    cluster: str,
    price: float,
    devices: int = 2,
    jurisdiction: str = "EU",
    provider: str = "acme",
    profile_follows: bool = False,
) -> Registered:
    """Register a node over the real gRPC API (as `cpn agent` does), then mark it alive on the bus."""
    request = agent_pb2.RegisterRequest(
        enrollment_token=token,
        region=region,
        cluster=cluster,
        provider=provider,
        hostname=f"{cluster}-n0",
        devices=[
            agent_pb2.Device(index=i, model="cpu", memory_gb=16.0, measured_tflops=0.5, kind="cpu")
            for i in range(devices)
        ],
        price_per_device_hour=price,
        advertise_host="127.0.0.1",
        sync_port_min=29000,
        sync_port_max=29049,
        jurisdiction=jurisdiction,
        agent_version="test",
        sandbox="bubblewrap",  # as an agent where bubblewrap works: it may run users' code
        profile_follows=profile_follows,  # True: listed "measuring", not placed, until a profile lands
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        # A guard against a hang, not a speed bound: a fresh server beside 4 busy loops and two
        # other test workers took over 10 s to answer its first registration.
        reply = agent_pb2_grpc.AgentServiceStub(channel).Register(request, timeout=60)
    heartbeat(server.ctx, reply.node_id)
    return Registered(reply.node_id, reply.node_token, reply.cluster_id)


def seed_fleet(server: ServerHandle, admin: CpnClient) -> dict[str, Registered]:
    """Two EU regions with different prices, linked; enrolled with a token issued over REST."""
    token = admin.create_token("acme", note="tests", max_uses=2)["token"]
    nodes = {
        "eu-west": register_node(server, token, region="eu-west", cluster="paris-1", price=1.2),
        "eu-north": register_node(server, token, region="eu-north", cluster="stockholm-1", price=0.9),
    }
    admin.put_link(
        src="eu-west", dst="eu-north", bandwidth_gbps=1.0, latency_ms=25.0, egress_price_per_gb=0.02
    )
    return nodes


def measure_link(server: ServerHandle, src: str, dst: str, rtt_ms: float = 20.0) -> str:
    """A probe of src -> dst as the resource layer orders and records it, with the figures an agent
    would report (5 MB timed over 0.5 s: 80 Mbit/s). Returns the probe id."""
    with server.ctx.session_factory() as s, s.begin():
        node = {
            region: node_id for node_id, region in s.execute(select(Node.id, Cluster.region).join(Cluster))
        }
        row = LinkProbe(
            src_region=src,
            dst_region=dst,
            src_node_id=node[src],
            dst_node_id=node[dst],
            bulk_bytes=8 << 20,
            echoes=5,
        )
        s.add(row)
        s.flush()
        result = {
            "probe_id": row.id,
            "rtt_ms": rtt_ms,
            "bulk_bytes": 5_000_000,
            "bulk_s": 0.5,
            "duration_s": 0.6,
        }
        record_result(s, node[src], result)
        return row.id


def new_tenant(admin: CpnClient, server: ServerHandle, name: str) -> tuple[dict[str, Any], CpnClient]:
    tenant = admin.create_tenant(name)
    key = admin.create_key(tenant["id"])["key"]
    return tenant, CpnClient(server.http_url, key)


def count_rows(server: ServerHandle) -> tuple[int, int]:
    with server.ctx.session_factory() as session:
        return (
            session.scalar(select(func.count()).select_from(Quote)) or 0,
            session.scalar(select(func.count()).select_from(Job)) or 0,
        )


def wait_placed(client: CpnClient, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Submission returns a queued job; poll until the placer has moved it on (placed or beyond)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        job = client.job(job_id)
        if job["status"] != "queued":
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still queued after {timeout_s:.0f}s: {job.get('deferred')}")
        time.sleep(0.05)
