"""Quote latency as a user sees it: POST /v1/quotes to a `cpn server` process on PostgreSQL + Redis
whose fleet joined through real gRPC registrations (one Register call per node, as agents do).

The generated fleet's busy nodes are not registered (a busy node's devices are not offered), so
the server offers exactly the free devices the plan-alone benchmark plans on. Agents do not hold
Connect streams here, so the server runs with a long heartbeat interval: no node is reaped while
the benchmark runs.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from _host import patience
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from contracts.lifetime import tied_env
from control_layer.planner.snapshot import ClusterInfo, NodeInfo, ResourceSnapshot
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = os.environ.get(
    "CPN_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("CPN_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _database() -> tuple[str, str]:
    name = f"cpn_bench_{secrets.token_hex(5)}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name, make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def _drop(name: str) -> None:
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _registration(
    cluster: ClusterInfo, node: NodeInfo, token: str, jurisdiction: str
) -> agent_pb2.RegisterRequest:
    return agent_pb2.RegisterRequest(
        enrollment_token=token,
        region=cluster.region,
        cluster=cluster.name,
        provider=cluster.provider,
        hostname=node.id,
        devices=[
            agent_pb2.Device(
                index=d.index, model=d.model, memory_gb=d.memory_gb, measured_tflops=d.tflops, kind=d.kind
            )
            for d in node.devices
        ],
        price_per_device_hour=cluster.price_per_device_hour,
        spot_price_per_device_hour=cluster.spot_price_per_device_hour or 0.0,
        agent_version="bench",
        advertise_host="127.0.0.1",
        sync_port_min=20000,
        sync_port_max=20100,
        intra_bandwidth_gbps=cluster.intra_bandwidth_gbps,
        jurisdiction=jurisdiction,
    )


def rest_latency(snap: ResourceSnapshot, specs: list[dict[str, Any]], *, workers: int = 4) -> dict[str, Any]:
    """Start a server, register ``snap``'s free nodes over gRPC, declare its links over REST, then
    time one POST /v1/quotes per spec (sequentially, as one user would)."""
    db_name, db_url = _database()
    http_port, grpc_port = _free_port(), _free_port()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(24)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CPN_DATABASE_URL": db_url,
        "CPN_REDIS_URL": REDIS_URL,
        "CPN_ADMIN_API_KEY": admin_key,
        "CPN_HEARTBEAT_INTERVAL_S": "600",
        "CPN_LOG_LEVEL": "WARNING",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "cpn", "server", "--port", str(http_port), "--grpc-port", str(grpc_port)],
        env=tied_env(env),  # it ends with the benchmark, however that ends
        cwd=ROOT,
    )
    try:
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{http_port}",
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=120,
        )
        ceiling = patience(120.0)
        deadline = time.monotonic() + ceiling
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the control plane did not answer /healthz within {ceiling:.0f} s")
            time.sleep(0.2)

        jurisdictions = {r.name: r.jurisdiction for r in snap.regions}
        # As the snapshot holds them: approved by an admin, the only ones data residency trusts.
        for region, jurisdiction in sorted(jurisdictions.items()):
            if jurisdiction:
                r = http.put(f"/v1/regions/{region}/jurisdiction", json={"jurisdiction": jurisdiction})
                r.raise_for_status()
        tokens = {}
        for provider in sorted({c.provider for c in snap.clusters}):
            r = http.post(
                "/v1/tokens", json={"provider": provider, "note": "bench", "ttl_s": 86400, "max_uses": None}
            )
            r.raise_for_status()
            tokens[provider] = r.json()["token"]
        requests = [
            _registration(c, n, tokens[c.provider], jurisdictions.get(c.region, ""))
            for c in snap.clusters
            for n in c.nodes
            if any(d.free for d in n.devices)
        ]
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda req: stub.Register(req, timeout=60), requests))
        register_s = time.perf_counter() - t0
        channel.close()
        for ln in snap.links:
            r = http.put(
                "/v1/links",
                json={
                    "src": ln.src,
                    "dst": ln.dst,
                    "bandwidth_gbps": ln.bandwidth_gbps,
                    "latency_ms": ln.latency_ms,
                    "egress_price_per_gb": ln.egress_price_per_gb,
                    "private": ln.private,
                },
            )
            r.raise_for_status()
        snapshot = http.get("/v1/snapshot").json()
        offered = sum(len(n["devices"]) for c in snapshot["clusters"] for n in c["nodes"])
        times, infeasible = [], 0
        http.post("/v1/quotes", json=specs[0])  # the first quote loads the live snapshot
        cpu = []
        for spec in specs:
            t, c = time.perf_counter(), _cpu_s(server.pid)
            r = http.post("/v1/quotes", json=spec)
            times.append((time.perf_counter() - t) * 1000.0)
            cpu.append((_cpu_s(server.pid) - c) * 1000.0)
            if r.status_code == 409:
                infeasible += 1
            elif r.status_code != 201:
                raise RuntimeError(f"quote failed: {r.status_code} {r.text[:500]}")
        http.close()
        return {
            "nodes_registered": len(requests),
            "clusters": len(snapshot["clusters"]),
            "devices": offered,
            "register_s": register_s,
            "quotes": len(specs),
            "infeasible": infeasible,
            "p50_ms": float(np.percentile(times, 50)),
            "p95_ms": float(np.percentile(times, 95)),
            "max_ms": float(max(times)),
            "p50_cpu_ms": float(np.percentile(cpu, 50)),
            "p95_cpu_ms": float(np.percentile(cpu, 95)),
        }
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        _drop(db_name)
